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
    /// Each read as a [`RawVf`] on its own, so that an error names the VF.
    pub vfs: Option<Vec<Box<serde_json::value::RawValue>>>,
    /// Huawei vNPU's template, unread here; typed only so that a value Go's
    /// `string` field refuses (a number, an array) is refused: Koordinator
    /// could not read the annotation, and would count none of its devices.
    #[serde(rename = "gpuSharedResourceTemplate")]
    pub _template: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct RawVf {
    pub minor: Option<i64>,
    #[serde(rename = "busID")]
    pub bus_id: Option<String>,
}

/// A quantity as JSON carries it: a string (what Koordinator writes) or a bare
/// number (what its Go comments show), kept as its JSON text: as an `f64`,
/// `100.000000000000001` would be read as a whole 100, where Go's
/// `resource.Quantity` reads the exact decimal.
pub(super) enum RawQuantity {
    Text(String),
    Number(String),
}

impl RawQuantity {
    pub(super) fn value(&self) -> Result<u64, QuantityError> {
        match self {
            RawQuantity::Text(s) | RawQuantity::Number(s) => parse_quantity(s),
        }
    }
}

impl<'de> Deserialize<'de> for RawQuantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        let text = raw.get();
        if text.starts_with('"') {
            // Go's `Quantity.UnmarshalJSON` strips the quotes and parses the
            // bytes between them without decoding escapes: `"\u0035\u0030"`,
            // 50 here, would be no quantity to Koordinator, which could then
            // not count what devgate granted.
            if text.contains('\\') {
                return Err(de::Error::custom("escapes in a quantity string"));
            }
            let s: String = serde_json::from_str(text).map_err(de::Error::custom)?;
            if s.len() > quantity::MAX_QUANTITY_LEN {
                return Err(de::Error::custom(QuantityError::TooLong));
            }
            return Ok(RawQuantity::Text(s));
        }
        if !text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
            return Err(de::Error::custom("expected a quantity string or number"));
        }
        if text.len() > quantity::MAX_QUANTITY_LEN {
            return Err(de::Error::custom(QuantityError::TooLong));
        }
        Ok(RawQuantity::Number(text.to_string()))
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
