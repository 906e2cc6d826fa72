//! The last resort: read a pod from the Kubernetes API with a kubeconfig.
//!
//! Only what the plugin needs: the current context's server, CA and credentials (bearer
//! token, token file, or client certificate), and one `GET` of the pod. TLS uses rustls
//! with exactly the CA the kubeconfig names; skipping verification is refused, because a
//! forged answer could switch a pod's redirection off.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;

use crate::{match_uid, LookupError, PodLookup, PodRef};

#[derive(Debug, Deserialize)]
struct RawConfig {
    #[serde(rename = "current-context", default)]
    current_context: String,
    #[serde(default)]
    clusters: Vec<Named<RawCluster>>,
    #[serde(default)]
    users: Vec<Named<RawUser>>,
    #[serde(default)]
    contexts: Vec<Named<RawContext>>,
}

#[derive(Debug, Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    item: T,
}

#[derive(Debug, Deserialize)]
struct RawCluster {
    server: String,
    #[serde(rename = "certificate-authority")]
    ca_file: Option<PathBuf>,
    #[serde(rename = "certificate-authority-data")]
    ca_data: Option<String>,
    #[serde(rename = "insecure-skip-tls-verify", default)]
    insecure: bool,
}

#[derive(Debug, Default, Deserialize)]
struct RawUser {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
    #[serde(rename = "client-certificate")]
    cert_file: Option<PathBuf>,
    #[serde(rename = "client-certificate-data")]
    cert_data: Option<String>,
    #[serde(rename = "client-key")]
    key_file: Option<PathBuf>,
    #[serde(rename = "client-key-data")]
    key_data: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawContext {
    cluster: String,
    #[serde(default)]
    user: String,
}

/// The usable part of a kubeconfig's current context.
#[derive(Debug, Clone)]
pub struct Kubeconfig {
    path: PathBuf,
    /// API server URL (`https://…`; `http://` is accepted for local test servers).
    pub server: String,
    ca_pem: Option<Vec<u8>>,
    token: Option<String>,
    client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl Kubeconfig {
    /// Reads and resolves `path`: current context, its cluster and user, with relative
    /// file references resolved against the kubeconfig's directory.
    pub fn load(path: &Path) -> Result<Kubeconfig, LookupError> {
        let err = |msg: String| LookupError::Kubeconfig {
            path: path.display().to_string(),
            msg,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let raw: RawConfig =
            serde_yaml::from_str(&text).map_err(|e| err(format!("not a kubeconfig: {e}")))?;
        let base = path.parent().unwrap_or(Path::new("/"));
        let ctx = if raw.current_context.is_empty() && raw.contexts.len() == 1 {
            &raw.contexts[0]
        } else {
            raw.contexts
                .iter()
                .find(|c| c.name == raw.current_context)
                .ok_or_else(|| {
                    err(format!(
                        "current-context {:?} is not among contexts",
                        raw.current_context
                    ))
                })?
        };
        let cluster = raw
            .clusters
            .iter()
            .find(|c| c.name == ctx.item.cluster)
            .ok_or_else(|| {
                err(format!(
                    "cluster {:?} (from context {:?}) is missing",
                    ctx.item.cluster, ctx.name
                ))
            })?;
        if cluster.item.insecure {
            return Err(err(format!(
                "cluster {:?} sets insecure-skip-tls-verify; interlock refuses it because a forged \
                 answer could turn a pod's redirection off — give it the cluster's CA instead",
                cluster.name
            )));
        }
        let empty = RawUser::default();
        let user = if ctx.item.user.is_empty() {
            &empty
        } else {
            raw.users
                .iter()
                .find(|u| u.name == ctx.item.user)
                .map(|u| &u.item)
                .ok_or_else(|| {
                    err(format!(
                        "user {:?} (from context {:?}) is missing",
                        ctx.item.user, ctx.name
                    ))
                })?
        };
        let read = |what: &str,
                    file: &Option<PathBuf>,
                    data: &Option<String>|
         -> Result<Option<Vec<u8>>, LookupError> {
            if let Some(d) = data {
                return base64::engine::general_purpose::STANDARD
                    .decode(d.trim())
                    .map(Some)
                    .map_err(|e| err(format!("{what}-data is not base64: {e}")));
            }
            match file {
                Some(f) => {
                    let f = base.join(f);
                    std::fs::read(&f)
                        .map(Some)
                        .map_err(|e| err(format!("{what} {}: {e}", f.display())))
                }
                None => Ok(None),
            }
        };
        let ca_pem = read(
            "certificate-authority",
            &cluster.item.ca_file,
            &cluster.item.ca_data,
        )?;
        let token = match (&user.token, &user.token_file) {
            (Some(t), _) => Some(t.trim().to_string()),
            (None, Some(f)) => {
                let f = base.join(f);
                Some(
                    std::fs::read_to_string(&f)
                        .map_err(|e| err(format!("tokenFile {}: {e}", f.display())))?
                        .trim()
                        .to_string(),
                )
            }
            (None, None) => None,
        };
        let cert = read("client-certificate", &user.cert_file, &user.cert_data)?;
        let key = read("client-key", &user.key_file, &user.key_data)?;
        let client_pem = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                return Err(err(
                    "client-certificate and client-key must be given together".into(),
                ))
            }
        };
        let server = cluster.item.server.trim_end_matches('/').to_string();
        if !(server.starts_with("https://") || server.starts_with("http://")) {
            return Err(err(format!("server {server:?} is not an http(s) URL")));
        }
        Ok(Kubeconfig {
            path: path.to_path_buf(),
            server,
            ca_pem,
            token,
            client_pem,
        })
    }

    fn agent(&self, timeout: Duration) -> Result<ureq::Agent, LookupError> {
        let mut b = ureq::AgentBuilder::new().timeout(timeout);
        if self.server.starts_with("https://") {
            b = b.tls_config(Arc::new(self.tls_config()?));
        }
        Ok(b.build())
    }

    fn tls_config(&self) -> Result<rustls::ClientConfig, LookupError> {
        let err = |msg: String| LookupError::Kubeconfig {
            path: self.path.display().to_string(),
            msg,
        };
        let ca = self.ca_pem.as_ref().ok_or_else(|| {
            err(
                "the cluster has no certificate-authority; interlock verifies the API server"
                    .into(),
            )
        })?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut ca.as_slice()) {
            let cert = cert.map_err(|e| err(format!("certificate-authority: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| err(format!("certificate-authority: {e}")))?;
        }
        if roots.is_empty() {
            return Err(err("certificate-authority holds no PEM certificate".into()));
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| err(e.to_string()))?
        .with_root_certificates(roots);
        match &self.client_pem {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let certs = rustls_pemfile::certs(&mut cert.as_slice())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| err(format!("client-certificate: {e}")))?;
                let key = rustls_pemfile::private_key(&mut key.as_slice())
                    .map_err(|e| err(format!("client-key: {e}")))?
                    .ok_or_else(|| err("client-key holds no private key".into()))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| err(format!("client certificate: {e}")))
            }
        }
    }

    /// Reads the pod from the API. 404 is an authoritative "no such pod".
    pub fn fetch_pod(&self, pod: &PodRef, timeout: Duration) -> Result<PodLookup, LookupError> {
        let url = format!(
            "{}/api/v1/namespaces/{}/pods/{}",
            self.server,
            path_segment(&pod.namespace),
            path_segment(&pod.name)
        );
        let api = |msg: String| LookupError::Api {
            url: url.clone(),
            msg,
        };
        let mut req = self
            .agent(timeout)?
            .get(&url)
            .set("Accept", "application/json");
        if let Some(t) = &self.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        let resp = match req.call() {
            Ok(r) => r,
            Err(ureq::Error::Status(404, _)) => return Ok(PodLookup::NotFound),
            Err(ureq::Error::Status(code, r)) => {
                let body = r.into_string().unwrap_or_default();
                return Err(api(format!(
                    "HTTP {code}: {}",
                    body.chars().take(300).collect::<String>()
                )));
            }
            Err(e) => return Err(api(e.to_string())),
        };
        let body: PodBody = resp
            .into_json()
            .map_err(|e| api(format!("bad pod JSON: {e}")))?;
        if !match_uid(pod, body.metadata.uid.as_deref()) {
            return Ok(PodLookup::NotFound);
        }
        Ok(PodLookup::Found {
            uid: body.metadata.uid,
            annotations: body.metadata.annotations.unwrap_or_default(),
        })
    }
}

#[derive(Deserialize)]
struct PodBody {
    metadata: PodMeta,
}

#[derive(Deserialize)]
struct PodMeta {
    uid: Option<String>,
    annotations: Option<BTreeMap<String, String>>,
}

/// Kubernetes names are DNS labels/subdomains, but percent-encode anything else rather than
/// trusting `CNI_ARGS` to build a URL.
fn path_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A fake API server on loopback answering one pod; records the Authorization header.
    fn fake_api() -> (String, std::sync::mpsc::Receiver<String>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let rx = interlock_testkit::http::serve_json(l, |path| {
            if path == "/api/v1/namespaces/shop/pods/cart-0" {
                ("200 OK".into(), r#"{"kind":"Pod","metadata":{"name":"cart-0","uid":"u-1","annotations":{"linkerd.io/proxy-version":"stable"}}}"#.into())
            } else {
                (
                    "404 Not Found".into(),
                    r#"{"kind":"Status","code":404}"#.into(),
                )
            }
        });
        (format!("http://{addr}"), rx)
    }

    fn kubeconfig(dir: &Path, server: &str, extra_user: &str) -> PathBuf {
        let p = dir.join("kubeconfig");
        std::fs::write(dir.join("token"), "s3cret\n").unwrap();
        std::fs::write(
            &p,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: node\nclusters:\n- name: c\n  cluster:\n    server: {server}\n\
                 users:\n- name: u\n  user:\n    tokenFile: token\n{extra_user}contexts:\n- name: node\n  context:\n    cluster: c\n    user: u\n"
            ),
        )
        .unwrap();
        p
    }

    #[test]
    fn fetches_annotations_with_the_token_file() {
        let dir = tempfile::tempdir().unwrap();
        let (server, seen) = fake_api();
        let kc = Kubeconfig::load(&kubeconfig(dir.path(), &server, "")).unwrap();
        let pod = PodRef {
            namespace: "shop".into(),
            name: "cart-0".into(),
            uid: Some("u-1".into()),
        };
        match kc.fetch_pod(&pod, Duration::from_secs(2)).unwrap() {
            PodLookup::Found { uid, annotations } => {
                assert_eq!(uid.as_deref(), Some("u-1"));
                assert_eq!(annotations["linkerd.io/proxy-version"], "stable");
            }
            other => panic!("{other:?}"),
        }
        let req = seen.recv().unwrap();
        assert!(
            req.starts_with("GET /api/v1/namespaces/shop/pods/cart-0 "),
            "{req}"
        );
        assert!(req.ends_with("Bearer s3cret"), "{req}");

        let gone = PodRef {
            namespace: "shop".into(),
            name: "gone".into(),
            uid: None,
        };
        assert_eq!(
            kc.fetch_pod(&gone, Duration::from_secs(2)).unwrap(),
            PodLookup::NotFound
        );
        let other_uid = PodRef {
            uid: Some("u-9".into()),
            ..pod
        };
        assert_eq!(
            kc.fetch_pod(&other_uid, Duration::from_secs(2)).unwrap(),
            PodLookup::NotFound
        );
    }

    #[test]
    fn refuses_insecure_and_reports_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kc");
        std::fs::write(&p, "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {server: 'https://10.0.0.1', insecure-skip-tls-verify: true}\n").unwrap();
        let e = Kubeconfig::load(&p).unwrap_err().to_string();
        assert!(
            e.contains("insecure-skip-tls-verify") && e.contains(&p.display().to_string()),
            "{e}"
        );

        std::fs::write(&p, "current-context: nope\ncontexts: []\n").unwrap();
        let e = Kubeconfig::load(&p).unwrap_err().to_string();
        assert!(e.contains("\"nope\""), "{e}");

        let e = Kubeconfig::load(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read"), "{e}");
    }

    #[test]
    fn https_without_a_ca_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let kc = Kubeconfig::load(&kubeconfig(dir.path(), "https://127.0.0.1:1", "")).unwrap();
        let pod = PodRef {
            namespace: "a".into(),
            name: "b".into(),
            uid: None,
        };
        let e = kc
            .fetch_pod(&pod, Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no certificate-authority"), "{e}");
    }

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(path_segment("web-0.a_b"), "web-0.a_b");
        assert_eq!(path_segment("a/../b"), "a%2F..%2Fb");
    }
}

/// The path real clusters use: HTTPS verified against the kubeconfig's CA.
#[cfg(test)]
mod tls_tests {
    use super::*;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use std::io::{Read, Write};
    use std::net::TcpListener;

    struct Pki {
        ca_pem: String,
        server_cert: CertificateDer<'static>,
        server_key: Vec<u8>,
    }

    fn pki() -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        let cert = params.signed_by(&key, &ca_cert, &ca_key).unwrap();
        Pki {
            ca_pem: ca_cert.pem(),
            server_cert: cert.der().clone(),
            server_key: key.serialize_der(),
        }
    }

    /// A TLS API server on loopback answering every request with one pod.
    fn tls_api(p: &Pki) -> String {
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![p.server_cert.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(p.server_key.clone())),
        )
        .unwrap();
        let cfg = Arc::new(cfg);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(tcp) = s else { continue };
                let conn = rustls::ServerConnection::new(cfg.clone()).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                // A client that rejects our certificate closes the handshake: move on.
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                if req.is_empty() {
                    continue;
                }
                let body =
                    r#"{"metadata":{"uid":"u-7","annotations":{"sidecar.istio.io/status":"{}"}}}"#;
                let _ = write!(
                    tls,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        format!("https://{addr}")
    }

    fn kubeconfig(dir: &Path, server: &str, ca_pem: &str) -> PathBuf {
        let p = dir.join("kubeconfig");
        let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        std::fs::write(
            &p,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: node\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
                 users:\n- name: u\n  user:\n    token: t0k\ncontexts:\n- name: node\n  context:\n    cluster: c\n    user: u\n"
            ),
        )
        .unwrap();
        p
    }

    #[test]
    fn https_with_the_clusters_ca_is_trusted() {
        let p = pki();
        let server = tls_api(&p);
        let dir = tempfile::tempdir().unwrap();
        let kc = Kubeconfig::load(&kubeconfig(dir.path(), &server, &p.ca_pem)).unwrap();
        let pod = PodRef {
            namespace: "shop".into(),
            name: "cart-0".into(),
            uid: Some("u-7".into()),
        };
        match kc.fetch_pod(&pod, Duration::from_secs(5)).unwrap() {
            PodLookup::Found { uid, annotations } => {
                assert_eq!(uid.as_deref(), Some("u-7"));
                assert!(annotations.contains_key("sidecar.istio.io/status"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn https_with_another_ca_is_refused() {
        let p = pki();
        let server = tls_api(&p);
        let other = pki();
        let dir = tempfile::tempdir().unwrap();
        let kc = Kubeconfig::load(&kubeconfig(dir.path(), &server, &other.ca_pem)).unwrap();
        let pod = PodRef {
            namespace: "shop".into(),
            name: "cart-0".into(),
            uid: None,
        };
        let e = kc
            .fetch_pod(&pod, Duration::from_secs(5))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&server) && e.to_lowercase().contains("certificate"),
            "{e}"
        );
    }
}
