//! Event subscription masks.
//!
//! The runtime delivers an event to a plugin only if the plugin set the
//! event's bit, `1 << (event - 1)`, in `ConfigureResponse.events`
//! (`pkg/api/event.go` `EventMask.Set`). A runtime rejects the whole
//! configuration if any bit is outside the events its NRI version knows
//! ("invalid plugin events", `adaptation/plugin.go` `configure`), and it
//! reads a mask of 0 as "everything".

use std::{fmt, ops::BitOr};

use crate::api::Event;

/// A set of [`Event`]s, in the wire layout of `ConfigureResponse.events`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EventMask(u32);

/// Every subscribable event, in wire order.
const ALL_EVENTS: [Event; 14] = [
    Event::RUN_POD_SANDBOX,
    Event::STOP_POD_SANDBOX,
    Event::REMOVE_POD_SANDBOX,
    Event::CREATE_CONTAINER,
    Event::POST_CREATE_CONTAINER,
    Event::START_CONTAINER,
    Event::POST_START_CONTAINER,
    Event::UPDATE_CONTAINER,
    Event::POST_UPDATE_CONTAINER,
    Event::STOP_CONTAINER,
    Event::REMOVE_CONTAINER,
    Event::UPDATE_POD_SANDBOX,
    Event::POST_UPDATE_POD_SANDBOX,
    Event::VALIDATE_CONTAINER_ADJUSTMENT,
];

impl EventMask {
    /// No events.
    pub const EMPTY: EventMask = EventMask(0);
    /// Events 1-11, all a runtime with NRI before v0.10 accepts (`LAST` was 12).
    pub const BEFORE_V0_10: EventMask = EventMask(0x7FF);
    /// Events 1-13, what CRI-O 1.33's pre-release NRI v0.9.1 accepts (`LAST` was 14).
    pub const SINCE_V0_9_1: EventMask = EventMask(0x1FFF);
    /// Events 1-14, all a runtime with NRI v0.10 or later accepts (`LAST` is 15).
    pub const SINCE_V0_10: EventMask = EventMask(0x3FFF);

    /// The mask holding only `event`; empty for `UNKNOWN` and `LAST`.
    pub const fn of(event: Event) -> EventMask {
        let n = event as u32;
        if n == 0 || n >= Event::LAST as u32 {
            EventMask::EMPTY
        } else {
            EventMask(1 << (n - 1))
        }
    }

    /// This mask plus `event`.
    pub const fn with(self, event: Event) -> EventMask {
        EventMask(self.0 | EventMask::of(event).0)
    }

    /// A mask from its wire bits; bits that name no event are dropped.
    pub const fn from_bits(bits: u32) -> EventMask {
        EventMask(bits & EventMask::SINCE_V0_10.0)
    }

    pub const fn bits(self) -> u32 {
        self.0
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub const fn contains(self, event: Event) -> bool {
        let bit = EventMask::of(event).0;
        bit != 0 && self.0 & bit == bit
    }

    pub const fn intersection(self, other: EventMask) -> EventMask {
        EventMask(self.0 & other.0)
    }

    /// The events of `self` that are not in `other`.
    pub const fn difference(self, other: EventMask) -> EventMask {
        EventMask(self.0 & !other.0)
    }

    /// The events in this mask, in wire order.
    pub fn events(self) -> impl Iterator<Item = Event> {
        ALL_EVENTS.into_iter().filter(move |e| self.contains(*e))
    }
}

impl BitOr for EventMask {
    type Output = EventMask;

    fn bitor(self, rhs: EventMask) -> EventMask {
        EventMask(self.0 | rhs.0)
    }
}

impl From<Event> for EventMask {
    fn from(event: Event) -> EventMask {
        EventMask::of(event)
    }
}

impl FromIterator<Event> for EventMask {
    fn from_iter<I: IntoIterator<Item = Event>>(iter: I) -> EventMask {
        iter.into_iter().fold(EventMask::EMPTY, EventMask::with)
    }
}

/// `0x60c [CREATE_CONTAINER, ...]`: the wire value, then the names.
impl fmt::Debug for EventMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x} ", self.0)?;
        f.debug_list().entries(self.events()).finish()
    }
}

impl fmt::Display for EventMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_follow_the_wire_layout() {
        // nri.md §1: Create | Stop | RemoveContainer | RemovePodSandbox = 0x60C.
        let mask: EventMask = [
            Event::CREATE_CONTAINER,
            Event::STOP_CONTAINER,
            Event::REMOVE_CONTAINER,
            Event::REMOVE_POD_SANDBOX,
        ]
        .into_iter()
        .collect();
        assert_eq!(mask.bits(), 0x60C);
        assert!(mask.contains(Event::STOP_CONTAINER));
        assert!(!mask.contains(Event::START_CONTAINER));
        assert_eq!(
            EventMask::of(Event::VALIDATE_CONTAINER_ADJUSTMENT).bits(),
            0x2000
        );
    }

    #[test]
    fn unknown_and_last_have_no_bit() {
        assert!(EventMask::of(Event::UNKNOWN).is_empty());
        assert!(EventMask::of(Event::LAST).is_empty());
        assert!(!EventMask::SINCE_V0_10.contains(Event::UNKNOWN));
    }

    #[test]
    fn ranges_match_valid_events_of_each_version() {
        assert_eq!(EventMask::BEFORE_V0_10.events().count(), 11);
        assert_eq!(EventMask::SINCE_V0_10.events().count(), 14);
        assert!(!EventMask::BEFORE_V0_10.contains(Event::UPDATE_POD_SANDBOX));
        assert_eq!(EventMask::from_bits(u32::MAX), EventMask::SINCE_V0_10);
    }

    #[test]
    fn set_operations() {
        let a = EventMask::of(Event::CREATE_CONTAINER) | Event::UPDATE_POD_SANDBOX.into();
        assert_eq!(
            a.intersection(EventMask::BEFORE_V0_10),
            EventMask::of(Event::CREATE_CONTAINER)
        );
        assert_eq!(
            a.difference(EventMask::BEFORE_V0_10),
            EventMask::of(Event::UPDATE_POD_SANDBOX)
        );
        assert_eq!(format!("{a}"), "0x808");
        assert!(format!("{a:?}").contains("UPDATE_POD_SANDBOX"));
    }
}
