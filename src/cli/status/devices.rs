//! The ledger as `-o json` shows it: the document as stored, each device
//! with its `state` and each holder with its pod as people name it.

use serde_json::{Map, Value};

use crate::ledger::{DeviceRecord, LedgerState};

/// `quarantined` (given to no pod, whatever its holders), `held` or `free`.
pub fn state(rec: &DeviceRecord) -> &'static str {
    if rec.quarantine.is_some() {
        "quarantined"
    } else if rec.holders.is_empty() {
        "free"
    } else {
        "held"
    }
}

/// `state`'s document with `devices.<d>.state` and `devices.<d>.holders[i].pod`
/// (`namespace/name`, or the sandbox id where the ledger has no record of it).
pub fn json(state: &LedgerState) -> Result<Map<String, Value>, serde_json::Error> {
    let mut doc = match serde_json::to_value(state)? {
        Value::Object(doc) => doc,
        _ => Map::new(),
    };
    let Some(Value::Object(devices)) = doc.get_mut("devices") else {
        return Ok(doc);
    };
    for (key, shown) in devices.iter_mut() {
        let (Some(rec), Value::Object(shown)) = (state.devices.get(key), shown) else {
            continue;
        };
        shown.insert("state".into(), self::state(rec).into());
        let Some(Value::Array(holders)) = shown.get_mut("holders") else {
            continue;
        };
        for (h, holder) in holders.iter_mut().zip(&rec.holders) {
            if let Value::Object(h) = h {
                h.insert("pod".into(), state.holder_name(&holder.sandbox_id).into());
            }
        }
    }
    Ok(doc)
}
