//! Which addresses a push call may connect to: a pure classifier over IP addresses and the
//! operator's allow list (`--push-allow`).
//!
//! Everything that is not an ordinary public unicast address is refused unless allowed:
//! loopback, private (RFC 1918), link-local (which holds the cloud metadata service at
//! 169.254.169.254), carrier-grade NAT, unique-local and link-local IPv6, IPv4-mapped,
//! IPv4-compatible and NAT64 IPv6 (they reach IPv4 hosts through a v6 literal), 6to4 and Teredo,
//! multicast, broadcast, unspecified, documentation, benchmarking and reserved ranges. The list
//! is a table of prefixes so that it can be read and tested line by line.
//!
//! **Architecture Invariant:** no I/O here: the check is a function of an address (and the name
//! it came from), so tests cover every class with literals and never open a socket.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use ipnet::IpNet;
use thiserror::Error;

/// Why an address is not an ordinary public one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressClass {
    Unspecified,
    Loopback,
    /// RFC 1918 (10/8, 172.16/12, 192.168/16).
    Private,
    /// 169.254/16 and fe80::/10.
    LinkLocal,
    /// 100.64/10 (RFC 6598).
    CarrierGradeNat,
    /// fc00::/7.
    UniqueLocal,
    /// fec0::/10 (deprecated, still routed by some stacks).
    SiteLocal,
    /// ::ffff:0:0/96.
    Ipv4Mapped,
    /// ::/96 (deprecated IPv4-compatible form).
    Ipv4Compatible,
    /// 64:ff9b::/96 and 64:ff9b:1::/48 (NAT64), 2002::/16 (6to4), 2001::/32 (Teredo).
    Ipv4Translated,
    Multicast,
    /// 255.255.255.255.
    Broadcast,
    /// 192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32.
    Documentation,
    /// 198.18/15, 2001:2::/48.
    Benchmarking,
    /// 0/8, 192.0.0/24, 240/4, 100::/64 and other special-purpose blocks.
    Reserved,
}

impl AddressClass {
    pub fn as_str(&self) -> &'static str {
        match self {
            AddressClass::Unspecified => "unspecified",
            AddressClass::Loopback => "loopback",
            AddressClass::Private => "private",
            AddressClass::LinkLocal => "link-local",
            AddressClass::CarrierGradeNat => "carrier-grade NAT",
            AddressClass::UniqueLocal => "unique-local",
            AddressClass::SiteLocal => "site-local",
            AddressClass::Ipv4Mapped => "IPv4-mapped",
            AddressClass::Ipv4Compatible => "IPv4-compatible",
            AddressClass::Ipv4Translated => "IPv4-translated",
            AddressClass::Multicast => "multicast",
            AddressClass::Broadcast => "broadcast",
            AddressClass::Documentation => "documentation",
            AddressClass::Benchmarking => "benchmarking",
            AddressClass::Reserved => "reserved",
        }
    }
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Special-purpose IPv4 blocks, most specific first where they overlap.
const V4: &[(Ipv4Addr, u8, AddressClass)] = &[
    (
        Ipv4Addr::new(255, 255, 255, 255),
        32,
        AddressClass::Broadcast,
    ),
    (Ipv4Addr::new(0, 0, 0, 0), 32, AddressClass::Unspecified),
    (Ipv4Addr::new(0, 0, 0, 0), 8, AddressClass::Reserved),
    (Ipv4Addr::new(10, 0, 0, 0), 8, AddressClass::Private),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        AddressClass::CarrierGradeNat,
    ),
    (Ipv4Addr::new(127, 0, 0, 0), 8, AddressClass::Loopback),
    (Ipv4Addr::new(169, 254, 0, 0), 16, AddressClass::LinkLocal),
    (Ipv4Addr::new(172, 16, 0, 0), 12, AddressClass::Private),
    (Ipv4Addr::new(192, 0, 0, 0), 24, AddressClass::Reserved),
    (Ipv4Addr::new(192, 0, 2, 0), 24, AddressClass::Documentation),
    (Ipv4Addr::new(192, 88, 99, 0), 24, AddressClass::Reserved),
    (Ipv4Addr::new(192, 168, 0, 0), 16, AddressClass::Private),
    (Ipv4Addr::new(198, 18, 0, 0), 15, AddressClass::Benchmarking),
    (
        Ipv4Addr::new(198, 51, 100, 0),
        24,
        AddressClass::Documentation,
    ),
    (
        Ipv4Addr::new(203, 0, 113, 0),
        24,
        AddressClass::Documentation,
    ),
    (Ipv4Addr::new(224, 0, 0, 0), 4, AddressClass::Multicast),
    (Ipv4Addr::new(240, 0, 0, 0), 4, AddressClass::Reserved),
];

/// Special-purpose IPv6 blocks, most specific first where they overlap.
const V6: &[(Ipv6Addr, u8, AddressClass)] = &[
    (Ipv6Addr::UNSPECIFIED, 128, AddressClass::Unspecified),
    (Ipv6Addr::LOCALHOST, 128, AddressClass::Loopback),
    (
        Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0),
        96,
        AddressClass::Ipv4Mapped,
    ),
    (
        Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0),
        96,
        AddressClass::Ipv4Compatible,
    ),
    (
        Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0),
        96,
        AddressClass::Ipv4Translated,
    ),
    (
        Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0),
        48,
        AddressClass::Ipv4Translated,
    ),
    (
        Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0),
        64,
        AddressClass::Reserved,
    ),
    (
        Ipv6Addr::new(0x2001, 0x2, 0, 0, 0, 0, 0, 0),
        48,
        AddressClass::Benchmarking,
    ),
    (
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0),
        32,
        AddressClass::Documentation,
    ),
    (
        Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0),
        32,
        AddressClass::Ipv4Translated,
    ),
    (
        Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0),
        23,
        AddressClass::Reserved,
    ),
    (
        Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0),
        16,
        AddressClass::Ipv4Translated,
    ),
    (
        Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0),
        20,
        AddressClass::Documentation,
    ),
    (
        Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
        7,
        AddressClass::UniqueLocal,
    ),
    (
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
        10,
        AddressClass::LinkLocal,
    ),
    (
        Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0),
        10,
        AddressClass::SiteLocal,
    ),
    (
        Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0),
        8,
        AddressClass::Multicast,
    ),
];

fn in_v4(addr: Ipv4Addr, net: Ipv4Addr, len: u8) -> bool {
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    u32::from(addr) & mask == u32::from(net) & mask
}

fn in_v6(addr: Ipv6Addr, net: Ipv6Addr, len: u8) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    };
    u128::from(addr) & mask == u128::from(net) & mask
}

/// The class of `addr`, or `None` for an ordinary public unicast address.
pub fn classify(addr: IpAddr) -> Option<AddressClass> {
    match addr {
        IpAddr::V4(a) => V4
            .iter()
            .find(|(net, len, _)| in_v4(a, *net, *len))
            .map(|(_, _, c)| *c),
        // Outside 2000::/3 nothing is allocated as global unicast.
        IpAddr::V6(a) => classify_v6_table(a).or_else(|| {
            (!in_v6(a, Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3))
                .then_some(AddressClass::Reserved)
        }),
    }
}

fn classify_v6_table(a: Ipv6Addr) -> Option<AddressClass> {
    V6.iter()
        .find(|(net, len, _)| in_v6(a, *net, *len))
        .map(|(_, _, c)| *c)
}

/// One `--push-allow` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowEntry {
    /// Any port on the addresses of a network (`10.0.0.0/8`, `127.0.0.1`, `::1`).
    Net(IpNet),
    /// One port on one address (`127.0.0.1:9000`, `[::1]:9000`).
    Socket(SocketAddr),
    /// One port of a host name as written in target URLs (`hooks.internal:8443`): every address
    /// the name resolves to is allowed on that port.
    HostPort { host: String, port: u16 },
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("push allow entry {entry:?}: {reason}")]
pub struct AllowEntryError {
    pub entry: String,
    pub reason: &'static str,
}

impl FromStr for AllowEntry {
    type Err = AllowEntryError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| AllowEntryError {
            entry: s.to_string(),
            reason,
        };
        let s = s.trim();
        if s.is_empty() {
            return Err(err("empty"));
        }
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(AllowEntry::Net(net.trunc()));
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(AllowEntry::Net(IpNet::from(ip)));
        }
        if let Ok(sock) = s.parse::<SocketAddr>() {
            return Ok(AllowEntry::Socket(sock));
        }
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(err(
                "expected a CIDR (10.0.0.0/8), an address, address:port or host:port",
            ));
        };
        let port: u16 = port.parse().map_err(|_| err("the port is not a number"))?;
        let host = host.to_ascii_lowercase();
        let valid = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !valid {
            return Err(err("the host is not a valid name"));
        }
        Ok(AllowEntry::HostPort { host, port })
    }
}

/// Why a destination was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "{addr} ({class} address) is not allowed as a push destination; allow it with --push-allow"
)]
pub struct Refused {
    pub addr: SocketAddr,
    pub class: AddressClass,
}

/// The operator's allow list. Empty by default: only public addresses are called.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    allow: Vec<AllowEntry>,
}

impl AddressPolicy {
    pub fn new(allow: Vec<AllowEntry>) -> Self {
        AddressPolicy { allow }
    }

    /// Parses entries as given on the command line.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, AllowEntryError> {
        entries
            .iter()
            .map(|e| e.as_ref().parse())
            .collect::<Result<Vec<_>, _>>()
            .map(AddressPolicy::new)
    }

    pub fn entries(&self) -> &[AllowEntry] {
        &self.allow
    }

    /// Whether `addr`, reached through the URL host `host`, may be connected to.
    pub fn check(&self, host: &str, addr: SocketAddr) -> Result<(), Refused> {
        let Some(class) = classify(addr.ip()) else {
            return Ok(());
        };
        let ip = addr.ip();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let allowed = self.allow.iter().any(|e| match e {
            AllowEntry::Net(net) => net.contains(&ip),
            AllowEntry::Socket(s) => s.ip() == ip && s.port() == addr.port(),
            AllowEntry::HostPort { host: h, port } => {
                h.eq_ignore_ascii_case(host) && *port == addr.port()
            }
        });
        if allowed {
            Ok(())
        } else {
            Err(Refused { addr, class })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> Option<AddressClass> {
        classify(s.parse().expect("address literal"))
    }

    #[test]
    fn every_refused_class() {
        use AddressClass::*;
        let cases = [
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Reserved),
            ("127.0.0.1", Loopback),
            ("127.255.0.9", Loopback),
            ("10.0.0.1", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("169.254.169.254", LinkLocal),
            ("100.64.0.1", CarrierGradeNat),
            ("100.127.255.254", CarrierGradeNat),
            ("224.0.0.1", Multicast),
            ("239.255.255.250", Multicast),
            ("255.255.255.255", Broadcast),
            ("240.0.0.1", Reserved),
            ("192.0.0.8", Reserved),
            ("192.0.2.1", Documentation),
            ("198.51.100.7", Documentation),
            ("203.0.113.9", Documentation),
            ("198.18.0.1", Benchmarking),
            ("::", Unspecified),
            ("::1", Loopback),
            ("::ffff:10.0.0.1", Ipv4Mapped),
            ("::ffff:127.0.0.1", Ipv4Mapped),
            ("::ffff:169.254.169.254", Ipv4Mapped),
            ("::ffff:8.8.8.8", Ipv4Mapped),
            ("::10.0.0.1", Ipv4Compatible),
            ("::127.0.0.1", Ipv4Compatible),
            ("64:ff9b::a00:1", Ipv4Translated),
            ("2002:a00:1::1", Ipv4Translated),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Ipv4Translated),
            ("fc00::1", UniqueLocal),
            ("fd12:3456:789a::1", UniqueLocal),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("fec0::1", SiteLocal),
            ("ff02::1", Multicast),
            ("ff0e::1", Multicast),
            ("2001:db8::1", Documentation),
            ("100::1", Reserved),
            ("4000::1", Reserved),
        ];
        for (addr, want) in cases {
            assert_eq!(class(addr), Some(want), "{addr}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for addr in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "172.32.0.1",
            "100.128.0.1",
            "169.253.255.255",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001:80b::200e",
        ] {
            assert_eq!(class(addr), None, "{addr}");
        }
        let p = AddressPolicy::default();
        assert!(
            p.check("example.com", "8.8.8.8:443".parse().unwrap())
                .is_ok()
        );
    }

    #[test]
    fn refused_unless_allowed() {
        let none = AddressPolicy::default();
        let err = none
            .check("169.254.169.254", "169.254.169.254:80".parse().unwrap())
            .unwrap_err();
        assert_eq!(err.class, AddressClass::LinkLocal);
        assert!(err.to_string().contains("--push-allow"));

        let p = AddressPolicy::parse(&[
            "127.0.0.1:9000",
            "10.1.0.0/16",
            "[::1]:7000",
            "hooks.internal:8443",
            "192.168.5.5",
        ])
        .expect("parse");
        let ok = |host: &str, a: &str| p.check(host, a.parse().unwrap()).is_ok();
        assert!(ok("127.0.0.1", "127.0.0.1:9000"));
        assert!(!ok("127.0.0.1", "127.0.0.1:9001"));
        assert!(!ok("127.0.0.2", "127.0.0.2:9000"));
        assert!(ok("10.1.2.3", "10.1.2.3:1"));
        assert!(!ok("10.2.0.1", "10.2.0.1:1"));
        assert!(ok("[::1]", "[::1]:7000"));
        assert!(!ok("[::1]", "[::1]:7001"));
        assert!(ok("Hooks.Internal", "10.9.9.9:8443"));
        assert!(!ok("hooks.internal", "10.9.9.9:8444"));
        assert!(!ok("other.internal", "10.9.9.9:8443"));
        assert!(ok("192.168.5.5", "192.168.5.5:80"));
        // An allowed IPv4 address is not reachable through its mapped IPv6 form by accident.
        assert!(!ok("::ffff:192.168.5.5", "[::ffff:192.168.5.5]:80"));
    }

    #[test]
    fn allow_entries_parse() {
        assert_eq!(
            "10.0.0.0/8".parse::<AllowEntry>().unwrap(),
            AllowEntry::Net("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(
            "10.1.2.3/8".parse::<AllowEntry>().unwrap(),
            AllowEntry::Net("10.0.0.0/8".parse().unwrap())
        );
        assert!(matches!(
            "127.0.0.1:9000".parse::<AllowEntry>().unwrap(),
            AllowEntry::Socket(_)
        ));
        for bad in ["", "10.0.0.0/33", "host", "host:port", "bad host:80", ":80"] {
            assert!(bad.parse::<AllowEntry>().is_err(), "{bad:?}");
        }
    }
}
