//! The containers a Synchronize found running without their allocation.
use std::fmt::Write as _;

use crate::plugin::unapplied_record::Unapplied;

pub fn table(list: &[Unapplied]) -> String {
    let mut out = String::from(
        "CONTAINERS WITHOUT THEIR ALLOCATION (created while devgate was not connected; restart them to get their devices)\n",
    );
    for u in list {
        let _ = writeln!(
            out,
            "  {}/{} container {} ({}), found at unix time {}",
            u.namespace, u.pod, u.container, u.id, u.found_unix
        );
    }
    out
}
