//! The one rule model every profile produces and every backend applies.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Everything a backend needs to capture a pod's traffic to its proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedirectSpec {
    /// UID the proxy runs as; its own outbound traffic is never captured.
    pub proxy_uid: u32,
    /// GID the proxy runs as; also exempt from outbound capture when set.
    pub proxy_gid: Option<u32>,
    /// Inbound capture (traffic arriving at the pod).
    pub inbound: InboundCapture,
    /// Outbound capture (traffic the pod's processes originate).
    pub outbound: OutboundCapture,
    /// Interfaces whose traffic is never captured (besides loopback).
    pub exclude_interfaces: Vec<String>,
    /// Address families to program.
    pub ipv4: bool,
    /// Address families to program.
    pub ipv6: bool,
}

/// Which inbound destination ports are captured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "mode", content = "ports")]
pub enum PortSelection {
    /// Every port (minus the exclusions).
    All,
    /// Only these ports (minus the exclusions); empty means none.
    Only(Vec<u16>),
}

/// Inbound capture settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboundCapture {
    /// Port the proxy accepts redirected inbound connections on.
    pub proxy_port: u16,
    /// Ports captured.
    pub include_ports: PortSelection,
    /// Ports never captured (the proxy's own admin/health ports belong here).
    pub exclude_ports: Vec<u16>,
}

/// Outbound capture settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboundCapture {
    /// Port the proxy accepts redirected outbound connections on.
    pub proxy_port: u16,
    /// Destination ports captured.
    pub include_ports: PortSelection,
    /// Destination ports never captured.
    pub exclude_ports: Vec<u16>,
    /// Destination networks captured; empty means every destination.
    pub include_cidrs: Vec<IpNet>,
    /// Destination networks never captured.
    pub exclude_cidrs: Vec<IpNet>,
}
