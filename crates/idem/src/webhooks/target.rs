//! Where a webhook may go. Merchants choose the URLs, so a URL is a request
//! to make idem's own network send a POST somewhere: by default only
//! `https://` to public addresses. Never loopback, private, shared (CGNAT),
//! link-local (the cloud metadata address among them), multicast, reserved or
//! documentation addresses, nor an IPv6 address that embeds one of those.
//!
//! The address is checked twice: when the endpoint is added (its name
//! resolved then) and again at every connection, by the resolver the
//! delivering client uses ([`PublicResolver`]), so a name that resolved to a
//! public address when it was added and to `127.0.0.1` later (DNS rebinding)
//! is refused when it matters. The client follows no redirect, uses no proxy
//! (a proxy would resolve the name itself), and has bounded timeouts.
//!
//! `--webhook-allow-private` ([`AddressPolicy::AllowPrivate`]) lifts the
//! address rule and allows `http://`, for receivers on a private network and
//! for tests; the process says so in its log.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;

/// Which addresses webhooks may be sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressPolicy {
    /// `https://` to public addresses only: the default.
    PublicOnly,
    /// Any address, `http://` too (`--webhook-allow-private`).
    AllowPrivate,
}

/// Why a URL is not a place idem sends webhooks to.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    #[error("{0:?} is not an absolute URL")]
    NotAUrl(String),
    #[error("webhook URLs must use https:// (http:// only with --webhook-allow-private)")]
    NotHttps,
    #[error("webhook URLs may not carry a user name or password")]
    Credentials,
    #[error("the URL has no host")]
    NoHost,
    #[error(
        "{host} is {ip}, not a public address (loopback, private, link-local and metadata \
         addresses are refused; --webhook-allow-private allows them)"
    )]
    NotPublic { host: String, ip: IpAddr },
    #[error("{host} does not resolve: {why}")]
    Unresolvable { host: String, why: String },
}

/// `url` as a webhook endpoint under `policy`: its shape, and, when it names
/// an address, that address. A name is checked by [`resolve_checked`].
pub fn parse_url(url: &str, policy: AddressPolicy) -> Result<Url, TargetError> {
    let parsed = Url::parse(url).map_err(|_| TargetError::NotAUrl(url.to_owned()))?;
    match (parsed.scheme(), policy) {
        ("https", _) | ("http", AddressPolicy::AllowPrivate) => {}
        _ => return Err(TargetError::NotHttps),
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(TargetError::Credentials);
    }
    let host = parsed.host_str().ok_or(TargetError::NoHost)?;
    if let (Some(ip), AddressPolicy::PublicOnly) = (literal_ip(&parsed), policy) {
        if !is_public(ip) {
            return Err(TargetError::NotPublic {
                host: host.to_owned(),
                ip,
            });
        }
    }
    Ok(parsed)
}

/// [`parse_url`], and, for a name under [`AddressPolicy::PublicOnly`], every
/// address it resolves to now must be public (what an endpoint is checked
/// with when it is added).
pub async fn resolve_checked(url: &str, policy: AddressPolicy) -> Result<Url, TargetError> {
    let parsed = parse_url(url, policy)?;
    if policy == AddressPolicy::AllowPrivate || literal_ip(&parsed).is_some() {
        return Ok(parsed);
    }
    let host = parsed.host_str().ok_or(TargetError::NoHost)?.to_owned();
    let port = parsed.port_or_known_default().unwrap_or(443);
    let addrs = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| TargetError::Unresolvable {
            host: host.clone(),
            why: e.to_string(),
        })?;
    let refused = addrs.map(|a| a.ip()).find(|ip| !is_public(*ip));
    match refused {
        Some(ip) => Err(TargetError::NotPublic { host, ip }),
        None => Ok(parsed),
    }
}

/// The address a URL's host is written as, if it is one.
pub fn literal_ip(url: &Url) -> Option<IpAddr> {
    match url.host()? {
        url::Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
        url::Host::Domain(_) => None,
    }
}

/// Whether `ip` is an address of the public internet.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240) // reserved
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) carries an IPv4 address in its last 32 bits.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        let [a, b] = s[6].to_be_bytes();
        let [c, d] = s[7].to_be_bytes();
        return is_public_v4(Ipv4Addr::new(a, b, c, d));
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || s[..6] == [0, 0, 0, 0, 0, 0]) // IPv4-compatible (deprecated)
}

/// A resolver that answers only with public addresses: the check made again
/// at every connection, after whatever the name's DNS says by then.
#[derive(Debug, Clone, Copy, Default)]
pub struct PublicResolver;

impl Resolve for PublicResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| is_public(a.ip()))
                .collect();
            if public.is_empty() {
                let refused = found.first().map_or_else(
                    || "no address".to_owned(),
                    |a| format!("{} (not a public address)", a.ip()),
                );
                return Err(format!("{host} resolves to {refused}").into());
            }
            let addrs: Addrs = Box::new(public.into_iter());
            Ok(addrs)
        })
    }
}

/// The HTTP client deliveries go out on: no redirects, no proxy, a bound on
/// connecting and on the whole attempt, and, unless `policy` allows private
/// addresses, the [`PublicResolver`].
pub fn client(
    policy: AddressPolicy,
    connect_timeout: Duration,
    timeout: Duration,
) -> reqwest::Result<reqwest::Client> {
    let builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(connect_timeout)
        .timeout(timeout)
        .user_agent(concat!("idem-webhooks/", env!("CARGO_PKG_VERSION")));
    match policy {
        AddressPolicy::PublicOnly => builder.dns_resolver(Arc::new(PublicResolver)).build(),
        AddressPolicy::AllowPrivate => builder.build(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "198.18.0.1",
            "192.0.0.8",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "::127.0.0.1",
        ] {
            let ip: IpAddr = private.parse().expect(private);
            assert!(!is_public(ip), "{private}");
        }
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            let ip: IpAddr = public.parse().expect(public);
            assert!(is_public(ip), "{public}");
        }
    }

    #[test]
    fn urls_are_https_public_and_without_credentials_by_default() {
        let strict = AddressPolicy::PublicOnly;
        assert!(parse_url("https://hooks.example.com/idem", strict).is_ok());
        assert!(parse_url("https://8.8.8.8/x", strict).is_ok());
        assert_eq!(
            parse_url("http://hooks.example.com/", strict),
            Err(TargetError::NotHttps)
        );
        assert_eq!(parse_url("ftp://x/", strict), Err(TargetError::NotHttps));
        assert_eq!(
            parse_url("https://u:p@hooks.example.com/", strict),
            Err(TargetError::Credentials)
        );
        assert!(matches!(
            parse_url("https://169.254.169.254/latest/meta-data", strict),
            Err(TargetError::NotPublic { .. })
        ));
        assert!(matches!(
            parse_url("https://[::1]:8443/", strict),
            Err(TargetError::NotPublic { .. })
        ));
        assert!(matches!(
            parse_url("not a url", strict),
            Err(TargetError::NotAUrl(_))
        ));
        let open = AddressPolicy::AllowPrivate;
        assert!(parse_url("http://127.0.0.1:9000/hook", open).is_ok());
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_when_added_and_when_sent() {
        assert!(matches!(
            resolve_checked("https://localhost/hook", AddressPolicy::PublicOnly).await,
            Err(TargetError::NotPublic { .. })
        ));
        let name: Name = "localhost".parse().expect("name");
        let refused = PublicResolver.resolve(name).await;
        assert!(refused.is_err(), "the resolver gives no loopback address");
    }
}
