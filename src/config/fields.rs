//! Readers of the file's values that serde's derive cannot write alone: counts with bounds,
//! choices written only as strings, a rate limiter's key, lists of networks, and a route's
//! policies (a name or a table). Each checks what its value alone can say, so that toml puts
//! the error at the value.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};

use super::file::{KeyKind, RoutePolicy};
use crate::rate_limit::{Cidr, Shadow};

/// A count from 1 to `MAX`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Count<const MAX: u32 = { u32::MAX }>(pub(super) u32);

impl Count {
    /// The default cost of a call.
    pub(super) fn one() -> Self {
        Count(1)
    }
}

/// The number alone, as a reload's error shows it.
impl<const MAX: u32> fmt::Debug for Count<MAX> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de, const MAX: u32> Deserialize<'de> for Count<MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Bounded<const MAX: u32>;
        impl<const MAX: u32> Visitor<'_> for Bounded<MAX> {
            type Value = Count<MAX>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an integer from 1 to {MAX}")
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Count<MAX>, E> {
                match u32::try_from(n) {
                    Ok(count @ 1..) if count <= MAX => Ok(Count(count)),
                    _ if n < 1 => Err(E::custom(format!("must be at least 1, not {n}"))),
                    _ => Err(E::custom(format!("must be at most {MAX}, not {n}"))),
                }
            }
        }
        d.deserialize_i64(Bounded::<MAX>)
    }
}

/// Reads a choice among names, such as `algorithm = "gcra"`, from a string only: serde's enums
/// would also take a table (`algorithm = { gcra = {} }`), which is no way to write a choice.
pub(super) fn choice<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let name = String::deserialize(d)?;
    T::deserialize(de::IntoDeserializer::<D::Error>::into_deserializer(name))
}

/// [`choice`] for a field that may be left out.
pub(super) fn some_choice<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    choice(d).map(Some)
}

/// Reads a section: a table of named instances.
pub(super) fn instances<'de, D, T>(d: D) -> Result<BTreeMap<String, T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Instances<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Instances<T> {
        type Value = BTreeMap<String, T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a table of named instances")
        }

        fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<Self::Value, M::Error> {
            BTreeMap::deserialize(de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_map(Instances(PhantomData))
}

/// Reads a list of networks in CIDR notation. Each item is checked here, after toml has read
/// it, so that an error is the field's (`trusted_proxies`), whichever item is wrong. The list is
/// a set (every use asks whether an address is in one of them): kept sorted and without
/// repeats, so that a file listing the same networks in another order changes nothing.
pub(super) fn cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Cidr>, D::Error> {
    struct Cidrs;
    impl<'de> Visitor<'de> for Cidrs {
        type Value = Vec<Cidr>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of CIDR strings")
        }

        fn visit_seq<S: de::SeqAccess<'de>>(self, mut items: S) -> Result<Vec<Cidr>, S::Error> {
            let mut out = Vec::new();
            while let Some(item) = items.next_element::<toml::Value>()? {
                let Some(text) = item.as_str() else {
                    let kind = item.type_str();
                    return Err(de::Error::custom(format!(
                        "must be a list of CIDR strings, not of {kind}s"
                    )));
                };
                let cidr = text.parse();
                out.push(cidr.map_err(|e| de::Error::custom(format!("`{text}`: {e}")))?);
            }
            out.sort_unstable();
            out.dedup();
            Ok(out)
        }
    }
    d.deserialize_seq(Cidrs)
}

/// [`cidrs`] for a field whose absence means something else than an empty list.
pub(super) fn some_cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Cidr>>, D::Error> {
    cidrs(d).map(Some)
}

impl<'de> Deserialize<'de> for KeyKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "peer_ip" => Ok(KeyKind::PeerIp),
            "forwarded_ip" => Ok(KeyKind::ForwardedIp),
            "global" => Ok(KeyKind::Global),
            other => match other.strip_prefix("header:") {
                Some(name) => (http::HeaderName::try_from(name.trim()).map(KeyKind::Header))
                    .map_err(|_| de::Error::custom(format!("`{name}` is not a valid header name"))),
                None => Err(de::Error::custom(format!(
                    "unknown key `{other}`; expected peer_ip, forwarded_ip, header:<name> or global"
                ))),
            },
        }
    }
}

/// Reads a route's policies: each a table, or a rate limiter's name alone (read as a table
/// naming only `limiter`).
pub(super) fn policies<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RoutePolicy>, D::Error> {
    struct PolicyItem(RoutePolicy);
    impl<'de> Deserialize<'de> for PolicyItem {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Item;
            impl<'de> Visitor<'de> for Item {
                type Value = PolicyItem;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a rate limiter name or a table with `limiter`")
                }

                fn visit_str<E: de::Error>(self, name: &str) -> Result<PolicyItem, E> {
                    Ok(PolicyItem(RoutePolicy {
                        limiter: name.to_owned(),
                        cost: Count::one(),
                        shadow: Shadow::Off,
                    }))
                }

                fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<PolicyItem, M::Error> {
                    let deserializer = de::value::MapAccessDeserializer::new(map);
                    RoutePolicy::deserialize(deserializer).map(PolicyItem)
                }
            }
            d.deserialize_any(Item)
        }
    }
    let items = Vec::<PolicyItem>::deserialize(d)?;
    Ok(items.into_iter().map(|PolicyItem(policy)| policy).collect())
}

impl<'de> Deserialize<'de> for Shadow {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Mode;
        impl Visitor<'_> for Mode {
            type Value = Shadow;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false or \"advertised\"")
            }

            fn visit_bool<E: de::Error>(self, shadow: bool) -> Result<Shadow, E> {
                Ok(if shadow { Shadow::Silent } else { Shadow::Off })
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Shadow, E> {
                match s {
                    "advertised" => Ok(Shadow::Advertised),
                    other => Err(E::custom(format!(
                        "must be true, false or \"advertised\", not \"{other}\""
                    ))),
                }
            }
        }
        d.deserialize_any(Mode)
    }
}
