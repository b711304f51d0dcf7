//! The outbound policy (SPEC section 7): which hosts an action may call.
//!
//! One policy for webhooks and plugins: the gateway is always allowed; an absolute `url`
//! must match an `allowed_hosts` entry by name, or, when `*` is listed, resolve only to
//! public addresses. Loopback, link-local, private, shared and unspecified ranges (and
//! IPv6 forms that embed such an IPv4 address: mapped, compatible, NAT64, 6to4) are
//! refused unless the host is listed by name, so a booking cannot reach into the network
//! kairos runs in.
//!
//! The check runs twice: before a call, for a clear refusal in the Plan's history; and
//! when the connection is made, by [`PolicyResolver`], on the very addresses the
//! connection uses, so that a name that resolves to a public address at the check and to
//! an internal one a moment later (DNS rebinding) is still refused.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::dns::Name;

use crate::config::AllowedHost;

/// Decides whether a target may be called.
#[derive(Debug, Clone, Default)]
pub struct OutboundPolicy {
    allowed: Vec<AllowedHost>,
    gateway: Option<(String, u16)>,
    knobs: Knobs,
}

/// Where the lists a refusal names are set, so that it says how to allow the target
/// where the run was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Knobs {
    /// `kairos serve`: the host's `--allowed-hosts`, and a plugin's `allowed_hosts`
    /// given at upload.
    #[default]
    Serve,
    /// `kairos plugins run`: `--allow` stands for both lists.
    PluginsRun,
}

impl Knobs {
    /// Where a plugin's own `allowed_hosts` is given, for a refusal by that list.
    pub fn plugin_list(self) -> &'static str {
        match self {
            Knobs::Serve => {
                "given at upload: `kairos plugins upload --allowed-hosts host:port`, or PUT /plugins/{name}?allowed_hosts=host:port"
            }
            Knobs::PluginsRun => "given to `kairos plugins run` with --allow host:port",
        }
    }

    /// Where the host's list is given.
    fn host_list(self) -> &'static str {
        match self {
            Knobs::Serve => "the host's allowlist (--allowed-hosts of kairos serve)",
            Knobs::PluginsRun => "the allowlist (--allow of kairos plugins run)",
        }
    }

    /// How to allow an internal address of `host`.
    fn allow_internal(self, host: &str) -> String {
        match self {
            Knobs::Serve => format!("list {host} in the host's --allowed-hosts to allow it"),
            Knobs::PluginsRun => format!("name {host} with --allow to allow it"),
        }
    }
}

/// The host and port a URI points at (default ports by scheme).
pub fn host_port(uri: &Uri) -> Option<(String, u16)> {
    let host = uri
        .host()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    });
    Some((host, port))
}

/// True for addresses that must not be reached unless listed by name.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_internal_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return is_internal_v4(v4);
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
                || v6 == Ipv6Addr::LOCALHOST
        }
    }
}

/// The IPv4 address an IPv6 address stands for, where it embeds one that a router or a
/// translator would reach: IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`,
/// NAT64 `64:ff9b::a.b.c.d` (RFC 6052) and its local-use `64:ff9b:1::/48` (RFC 8215),
/// and 6to4 `2002:AABB:CCDD::/48` (RFC 3056).
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    // ::a.b.c.d, but not :: and ::1, which are unspecified and loopback themselves.
    if s[..6] == [0; 6] && (s[6] != 0 || s[7] > 1) {
        return Some(low);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) {
        return Some(low);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

fn is_internal_v4(v4: Ipv4Addr) -> bool {
    let [a, b, ..] = v4.octets();
    v4.is_loopback()
        || v4.is_private()
        || v4.is_link_local()
        || v4.is_unspecified()
        || v4.is_broadcast()
        || v4.is_multicast()
        || (a == 100 && (64..128).contains(&b)) // shared address space 100.64/10
        || a == 0
}

impl OutboundPolicy {
    pub fn new(allowed: Vec<AllowedHost>, gateway_url: Option<&str>) -> Self {
        let gateway = gateway_url
            .and_then(|g| g.parse::<Uri>().ok())
            .and_then(|uri| host_port(&uri));
        OutboundPolicy {
            allowed,
            gateway,
            knobs: Knobs::Serve,
        }
    }

    /// The same policy, its refusals naming `knobs`' flags.
    pub fn with_knobs(mut self, knobs: Knobs) -> Self {
        self.knobs = knobs;
        self
    }

    /// Where the lists this policy's refusals name are set.
    pub fn knobs(&self) -> Knobs {
        self.knobs
    }

    /// Ok when `uri` may be called now; otherwise a sentence for the Plan's history.
    pub async fn check(&self, uri: &Uri) -> Result<(), String> {
        self.check_with(uri, false).await
    }

    /// As [`check`](Self::check), for a caller that may reach public addresses only: a
    /// plugin whose own `allowed_hosts` covers the target only through `*`. The gateway
    /// and the hosts listed here pass this host's list, but must still resolve to
    /// public addresses, so that `*` never reaches what only the host's list names.
    pub async fn check_public(&self, uri: &Uri) -> Result<(), String> {
        self.check_with(uri, true).await
    }

    /// Whether connections to `host` may use any address it resolves to: it is the
    /// gateway's host or listed by name (on any port; the port was checked before).
    fn trusts_name(&self, host: &str) -> bool {
        self.gateway.as_ref().is_some_and(|(h, _)| h == host)
            || self.allowed.iter().any(|entry| match entry {
                AllowedHost::Host { host: h, .. } => h == host,
                AllowedHost::AnyPublic => false,
            })
    }

    /// Refuses at booking what no DNS answer could ever allow: a URL whose host is a
    /// literal address that is neither the gateway nor listed, and is internal (or is
    /// anything at all when the host's list has no `*`). Names are checked when fired.
    pub fn check_literal(&self, uri: &Uri) -> Result<(), String> {
        let Some((host, _)) = host_port(uri) else {
            return Err(format!("`{uri}` has no host"));
        };
        if host.parse::<IpAddr>().is_err() {
            return Ok(());
        }
        match futures_util::FutureExt::now_or_never(self.check_with(uri, false)) {
            Some(result) => result,
            None => Ok(()),
        }
    }

    async fn check_with(&self, uri: &Uri, public_only: bool) -> Result<(), String> {
        let (host, port) = host_port(uri).ok_or_else(|| format!("`{uri}` has no host"))?;
        let gateway = self.gateway.as_ref() == Some(&(host.clone(), port));
        let listed = self.allowed.iter().any(|entry| match entry {
            AllowedHost::Host { host: h, port: p } => *h == host && p.is_none_or(|p| p == port),
            AllowedHost::AnyPublic => false,
        });
        if (gateway || listed) && !public_only {
            return Ok(());
        }
        if !gateway && !listed && !self.allowed.contains(&AllowedHost::AnyPublic) {
            return Err(format!(
                "outbound policy: {host}:{port} is not on {}",
                self.knobs.host_list()
            ));
        }
        let addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|e| format!("outbound policy: cannot resolve {host}: {e}"))?
                .map(|a| a.ip())
                .collect(),
        };
        if let Some(ip) = addrs.iter().find(|ip| is_internal(**ip)) {
            return Err(format!(
                "outbound policy: {host} resolves to {ip}, a loopback, link-local or private address; {}",
                self.knobs.allow_internal(&host)
            ));
        }
        if addrs.is_empty() {
            return Err(format!("outbound policy: {host} has no address"));
        }
        Ok(())
    }
}

/// Resolves names for outbound connections and keeps only the addresses the policy
/// allows for that name, so the connection goes to an address that was checked (see the
/// module docs). Literal addresses in URLs do not come here; [`OutboundPolicy::check`]
/// has decided them already.
#[derive(Clone)]
pub struct PolicyResolver {
    policy: Arc<OutboundPolicy>,
    /// For a plugin whose own `allowed_hosts` grants the target only through `*`: public
    /// addresses only, even for a name this host trusts.
    public_only: bool,
}

impl PolicyResolver {
    pub fn new(policy: Arc<OutboundPolicy>, public_only: bool) -> Self {
        PolicyResolver {
            policy,
            public_only,
        }
    }
}

type Resolving =
    Pin<Box<dyn Future<Output = std::io::Result<std::vec::IntoIter<SocketAddr>>> + Send>>;

impl tower_service::Service<Name> for PolicyResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Resolving;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let policy = self.policy.clone();
        let public_only = self.public_only;
        Box::pin(async move {
            let host = name.as_str().to_ascii_lowercase();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if public_only || !policy.trusts_name(&host) {
                if let Some(bad) = addrs.iter().find(|a| is_internal(a.ip())) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!(
                            "outbound policy: {host} resolved to {}, a loopback, link-local or private address, when connecting",
                            bad.ip()
                        ),
                    ));
                }
            }
            Ok(addrs.into_iter())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(host: &str, port: Option<u16>) -> AllowedHost {
        AllowedHost::Host {
            host: host.into(),
            port,
        }
    }

    #[tokio::test]
    async fn gateway_and_listed_hosts_pass_others_do_not() {
        let policy = OutboundPolicy::new(
            vec![
                entry("127.0.0.1", Some(9000)),
                entry("hooks.internal", None),
            ],
            Some("http://127.0.0.1:8000"),
        );
        let ok = |u: &str| u.parse::<Uri>().unwrap();
        assert!(policy.check(&ok("http://127.0.0.1:8000/x")).await.is_ok());
        assert!(policy.check(&ok("http://127.0.0.1:9000/x")).await.is_ok());
        assert!(policy
            .check(&ok("http://hooks.internal:1234/x"))
            .await
            .is_ok());
        let denied = policy
            .check(&ok("http://127.0.0.1:9001/x"))
            .await
            .unwrap_err();
        assert!(denied.contains("not on the host's allowlist"), "{denied}");
    }

    /// A refusal says how to allow the target where the run was made: `kairos serve`'s
    /// --allowed-hosts, or `kairos plugins run`'s --allow.
    #[tokio::test]
    async fn a_refusal_names_the_flag_of_its_context() {
        let uri = "http://127.0.0.1:9001/x".parse::<Uri>().unwrap();
        let listed = vec![entry("127.0.0.1", Some(9000))];
        let serve = OutboundPolicy::new(listed.clone(), None);
        let run = OutboundPolicy::new(listed, None).with_knobs(Knobs::PluginsRun);
        let why = serve.check(&uri).await.unwrap_err();
        assert!(why.ends_with("(--allowed-hosts of kairos serve)"), "{why}");
        let why = run.check(&uri).await.unwrap_err();
        assert!(
            why.ends_with("(--allow of kairos plugins run)") && !why.contains("allowed-hosts"),
            "{why}"
        );
        // `*` reaches public addresses only; a loopback one is allowed by naming it.
        let serve = OutboundPolicy::new(vec![AllowedHost::AnyPublic], None);
        let run = serve.clone().with_knobs(Knobs::PluginsRun);
        let why = serve.check(&uri).await.unwrap_err();
        assert!(
            why.ends_with("list 127.0.0.1 in the host's --allowed-hosts to allow it"),
            "{why}"
        );
        let why = run.check(&uri).await.unwrap_err();
        assert!(
            why.ends_with("name 127.0.0.1 with --allow to allow it"),
            "{why}"
        );
        assert_ne!(Knobs::Serve.plugin_list(), Knobs::PluginsRun.plugin_list());
        assert!(Knobs::PluginsRun
            .plugin_list()
            .contains("--allow host:port"));
        assert!(Knobs::Serve
            .plugin_list()
            .contains("?allowed_hosts=host:port"));
    }

    #[tokio::test]
    async fn any_public_still_refuses_internal_addresses() {
        let policy = OutboundPolicy::new(vec![AllowedHost::AnyPublic], None);
        for url in [
            "http://127.0.0.1/",
            "http://10.1.2.3/",
            "http://192.168.0.1/",
            "http://172.16.5.4/",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]/",
            "http://[fe80::1]/",
            "http://[fd00::1]/",
            "http://100.64.0.1/",
            "http://localhost:8080/",
            // IPv6 forms of internal IPv4 addresses: compatible, NAT64, 6to4.
            "http://[::127.0.0.1]/",
            "http://[::a00:1]/",
            "http://[64:ff9b::7f00:1]/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[64:ff9b:1::c0a8:1]/",
            "http://[2002:7f00:1::1]/",
        ] {
            let err = policy.check(&url.parse().unwrap()).await.unwrap_err();
            assert!(
                err.contains("private") || err.contains("resolve"),
                "{url}: {err}"
            );
        }
        assert!(policy
            .check(&"http://93.184.215.14/".parse().unwrap())
            .await
            .is_ok());
        assert!(
            policy
                .check(&"http://[64:ff9b::5db8:d70e]/".parse().unwrap())
                .await
                .is_ok(),
            "NAT64 of a public address is public"
        );
    }

    #[tokio::test]
    async fn the_resolver_refuses_a_name_that_resolves_inside() {
        use tower_service::Service;
        let policy = Arc::new(OutboundPolicy::new(vec![AllowedHost::AnyPublic], None));
        let mut resolver = PolicyResolver::new(policy.clone(), false);
        // `localhost` stands for a name that a rebinding DNS turned internal after the check.
        let name: Name = "localhost".parse().unwrap();
        let err = resolver.call(name).await.unwrap_err();
        assert!(err.to_string().contains("when connecting"), "{err}");
        // Listed by name, the same name connects (only when the caller is not public-only).
        let policy = Arc::new(OutboundPolicy::new(vec![entry("localhost", None)], None));
        let addrs: Vec<SocketAddr> = PolicyResolver::new(policy.clone(), false)
            .call("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(!addrs.is_empty());
        assert!(PolicyResolver::new(policy, true)
            .call("localhost".parse().unwrap())
            .await
            .is_err());
    }

    #[tokio::test]
    async fn public_only_callers_get_the_gateway_and_listed_hosts_only_when_public() {
        let policy = OutboundPolicy::new(
            vec![entry("127.0.0.1", Some(9000)), entry("93.184.215.14", None)],
            Some("http://127.0.0.1:8000"),
        );
        let uri = |u: &str| u.parse::<Uri>().unwrap();
        for url in ["http://127.0.0.1:8000/x", "http://127.0.0.1:9000/x"] {
            assert!(policy.check(&uri(url)).await.is_ok(), "{url}");
            let err = policy.check_public(&uri(url)).await.unwrap_err();
            assert!(err.contains("private"), "{url}: {err}");
        }
        assert!(policy
            .check_public(&uri("http://93.184.215.14/"))
            .await
            .is_ok());
        // Not on this host's list at all: refused as before.
        let err = policy
            .check_public(&uri("http://93.184.215.15/"))
            .await
            .unwrap_err();
        assert!(err.contains("not on the host's allowlist"), "{err}");
    }
}
