//! Tables keyed by a PCI address (`[vf.pf]`, `[sriov.num_vfs]`). The address is
//! read leniently (any hex case, the domain left out or short), so one PF can
//! be written two ways that TOML takes for two keys; a map would keep the
//! later and drop the other's settings (a tenant VLAN, a VF count) without a
//! word. Such a table is refused instead, naming both spellings.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::inventory::PciAddr;

/// `deserialize_with` for a `BTreeMap<PciAddr, V>`.
pub fn unique<'de, D, V>(d: D) -> Result<BTreeMap<PciAddr, V>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    d.deserialize_map(Keys(PhantomData))
}

struct Keys<V>(PhantomData<V>);

impl<'de, V: Deserialize<'de>> Visitor<'de> for Keys<V> {
    type Value = BTreeMap<PciAddr, V>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a table keyed by PCI address")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        let mut spelled: BTreeMap<PciAddr, String> = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            let addr: PciAddr = key.parse().map_err(serde::de::Error::custom)?;
            let value = map.next_value::<V>()?;
            if let Some(first) = spelled.insert(addr, key.clone()) {
                return Err(serde::de::Error::custom(format!(
                    "{addr} is named twice, as {first:?} and {key:?}"
                )));
            }
            out.insert(addr, value);
        }
        Ok(out)
    }
}
