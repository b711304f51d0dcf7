//! The outbound policy (SPEC section 7): which hosts an action may call.
//!
//! One policy for webhooks (and, later, plugins): the gateway is always allowed; an
//! absolute `url` must match an `allowed_hosts` entry by name, or, when `*` is listed,
//! resolve only to public addresses. Loopback, link-local, private, shared and
//! unspecified ranges are refused unless the host is listed by name, so a booking cannot
//! reach into the network kairos runs in.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use axum::http::Uri;

use crate::config::AllowedHost;

/// Decides whether a target may be called.
#[derive(Debug, Clone, Default)]
pub struct OutboundPolicy {
    allowed: Vec<AllowedHost>,
    gateway: Option<(String, u16)>,
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
            if let Some(v4) = v6.to_ipv4_mapped() {
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
        OutboundPolicy { allowed, gateway }
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
                "outbound policy: {host}:{port} is not on the allowlist (allowed_hosts)"
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
                "outbound policy: {host} resolves to {ip}, a loopback, link-local or private address; list {host} in allowed_hosts to allow it"
            ));
        }
        if addrs.is_empty() {
            return Err(format!("outbound policy: {host} has no address"));
        }
        Ok(())
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
        assert!(denied.contains("not on the allowlist"), "{denied}");
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
        assert!(err.contains("not on the allowlist"), "{err}");
    }
}
