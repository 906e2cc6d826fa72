//! The verbs of `interlock-cni`, one file each, behind the protocol skeleton
//! (`interlock_cni_types::skel`): [`InterlockCni`] parses the entry and opens the log for
//! every call ([`Ctx`]) and hands each verb a `Call` (the invocation, the entry, the log).

mod add;
mod check;
mod del;
mod gc;
mod guard;
mod status;

pub use status::check_status;

use interlock_cni_types::skel::{Invocation, Plugin};
use interlock_cni_types::{CniError, CniResult};
use interlock_contract::config::PluginConfig;
use interlock_contract::{codes, layout};

use crate::log::Logger;
use interlock_attach::state::AttachmentKey;

/// The plugin: its verbs for the skeleton.
#[derive(Debug, Clone, Copy, Default)]
pub struct InterlockCni;

/// What every verb needs besides the invocation: the parsed entry and the log.
#[derive(Debug)]
pub struct Ctx {
    /// The interlock-cni entry.
    pub config: PluginConfig,
    /// The log, every line prefixed with the verb and the attachment.
    pub log: Logger,
}

/// One verb's view of the call.
pub(crate) struct Call<'a> {
    pub inv: &'a Invocation<'a>,
    pub config: &'a PluginConfig,
    pub log: &'a Logger,
}

impl Call<'_> {
    fn err(&self, code: u32, msg: impl Into<String>) -> CniError {
        self.inv.err(code, msg)
    }

    fn key(&self) -> AttachmentKey {
        AttachmentKey {
            container_id: self.inv.container_id().to_string(),
            ifname: self.inv.ifname().to_string(),
        }
    }

    /// `prevResult`, required: interlock-cni is a chained plugin.
    fn prev_result(&self, verb: &str) -> Result<CniResult, CniError> {
        self.inv.prev_result()?.ok_or_else(|| {
            if self.inv.network() == layout::HOLDING_NETWORK {
                return self.err(
                    codes::TRY_AGAIN_LATER,
                    format!(
                        "{verb} refused: this node has no primary CNI config yet, so no pod can get \
                         an address and its redirection; the interlock agent holds pod creation \
                         until the primary plugin writes its config (fail closed)"
                    ),
                );
            }
            self.err(
                codes::INVALID_NETWORK_CONFIG,
                format!(
                    "prevResult: missing: interlock-cni is a chained plugin and needs the primary plugin's result for {verb}; \
                     put it after the primary plugin (bridge, calico, …) in the plugins list, never first"
                ),
            )
        })
    }
}

/// `1.23 ms` (rounded half up; integer arithmetic: float formatting would bring its
/// slow path, which runs only for some values, onto the plugin's pages).
fn ms(us: u64) -> String {
    let hundredths = us.saturating_add(5) / 10;
    format!("{}.{:02} ms", hundredths / 100, hundredths % 100)
}

impl InterlockCni {
    fn call<'a>(inv: &'a Invocation<'a>, ctx: &'a Ctx) -> Call<'a> {
        Call {
            inv,
            config: &ctx.config,
            log: &ctx.log,
        }
    }
}

impl Plugin for InterlockCni {
    type Context = Ctx;

    fn name(&self) -> &str {
        interlock_contract::PLUGIN_TYPE
    }

    fn context(&self, inv: &Invocation) -> Result<Ctx, CniError> {
        let config = PluginConfig::from_map(&inv.conf)
            .map_err(|e| inv.err(codes::INVALID_NETWORK_CONFIG, e.to_string()))?;
        let log = Logger::new(config.log_level, config.log_file.clone()).with_context(format!(
            "{} {}/{}",
            inv.command,
            inv.env.container_id.as_deref().unwrap_or("-"),
            inv.env.ifname.as_deref().unwrap_or("-")
        ));
        Ok(Ctx { config, log })
    }

    fn add(&self, inv: &Invocation, ctx: &Ctx) -> Result<CniResult, CniError> {
        let call = Self::call(inv, ctx);
        match &ctx.config.guard {
            Some(role) => guard::add(&call, role),
            None => add::add(&call),
        }
    }

    fn del(&self, inv: &Invocation, ctx: &Ctx) -> Result<(), CniError> {
        let call = Self::call(inv, ctx);
        if ctx.config.guard.is_some() && !guard::has_state(&call) {
            return Ok(());
        }
        del::del(&call)
    }

    fn check(&self, inv: &Invocation, ctx: &Ctx) -> Result<(), CniError> {
        let call = Self::call(inv, ctx);
        match &ctx.config.guard {
            Some(role) => guard::check(&call, role),
            None => check::check(&call),
        }
    }

    fn gc(&self, inv: &Invocation, ctx: &Ctx) -> Result<(), CniError> {
        gc::gc(&Self::call(inv, ctx))
    }

    fn status(&self, inv: &Invocation, ctx: &Ctx) -> Result<(), CniError> {
        status::status(&Self::call(inv, ctx))
    }

    fn failed(&self, _inv: &Invocation, ctx: &Ctx, e: &CniError) {
        ctx.log.error(&format!("failed: {e}"));
    }

    fn internal_error(&self) -> CniError {
        crate::internal_error()
    }

    fn build_version(&self) -> Option<&'static str> {
        Some(interlock_buildinfo::VERSION)
    }
}

#[cfg(test)]
mod tests {
    use super::ms;

    #[test]
    fn durations_print_in_hundredths_of_a_millisecond_rounded_half_up() {
        assert_eq!(ms(0), "0.00 ms");
        assert_eq!(ms(4), "0.00 ms");
        assert_eq!(ms(5), "0.01 ms");
        assert_eq!(ms(391), "0.39 ms");
        assert_eq!(ms(1234), "1.23 ms");
        assert_eq!(ms(1995), "2.00 ms");
        assert_eq!(ms(12_345_678), "12345.68 ms");
        assert_eq!(ms(u64::MAX), "18446744073709551.61 ms");
    }
}
