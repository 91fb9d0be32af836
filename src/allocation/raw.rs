//! Permissive serde shapes of the annotation: what JSON may carry before validation.
use std::collections::BTreeSet;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::parse::clip;
use super::quantity::{self, parse_quantity, QuantityError};

#[derive(Deserialize)]
pub(super) struct RawEntry {
    pub minor: Option<i64>,
    pub id: Option<String>,
    pub resources: Option<UniqueMap<RawQuantity>>,
    pub extension: Option<RawExtension>,
}

#[derive(Deserialize)]
pub(super) struct RawExtension {
    pub vfs: Option<Vec<RawVf>>,
}

#[derive(Deserialize)]
pub(super) struct RawVf {
    pub minor: Option<i64>,
    #[serde(rename = "busID")]
    pub bus_id: Option<String>,
}

/// A quantity as JSON carries it: a string (what Koordinator writes) or a bare
/// number (what its Go comments show).
pub(super) enum RawQuantity {
    Text(String),
    Int(i64),
    Uint(u64),
    Float(f64),
}

impl RawQuantity {
    pub(super) fn value(&self) -> Result<u64, QuantityError> {
        match self {
            RawQuantity::Text(s) => parse_quantity(s),
            RawQuantity::Uint(v) => Ok(*v),
            RawQuantity::Int(v) if *v < 0 => Err(QuantityError::Negative(v.to_string())),
            RawQuantity::Int(v) => Ok(v.unsigned_abs()),
            // Display of f64 is exact and never uses an exponent, so the string
            // parser decides wholeness and range.
            RawQuantity::Float(v) if *v < 0.0 => Err(QuantityError::Negative(v.to_string())),
            RawQuantity::Float(v) => parse_quantity(&v.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for RawQuantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawQuantity;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a quantity string or number")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawQuantity, E> {
                if v.len() > quantity::MAX_QUANTITY_LEN {
                    return Err(E::custom(QuantityError::TooLong));
                }
                Ok(RawQuantity::Text(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawQuantity, E> {
                Ok(RawQuantity::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawQuantity, E> {
                Ok(RawQuantity::Uint(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawQuantity, E> {
                Ok(RawQuantity::Float(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// A JSON object read in order, failing on a repeated key.
pub(super) struct UniqueMap<V>(pub Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for UniqueMap<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MapVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for MapVisitor<V> {
            type Value = UniqueMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a json object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut seen = BTreeSet::new();
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key.clone()) {
                        return Err(de::Error::custom(format_args!(
                            "duplicate key {:?}",
                            clip(&key)
                        )));
                    }
                    out.push((key, map.next_value()?));
                }
                Ok(UniqueMap(out))
            }
        }
        d.deserialize_map(MapVisitor(PhantomData))
    }
}
