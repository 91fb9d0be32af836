//! Unit tests of the netlink messages, the attach/detach logic and the records.
mod altnames;
mod chars;
mod ethtool;
mod identity;
mod logic;
mod msg;
mod rig;
mod store;
