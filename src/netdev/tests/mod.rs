//! Unit tests of the netlink messages, the attach/detach logic and the records.
mod altname_lookup;
mod altnames;
mod chars;
mod edges;
mod ethtool;
mod ethtool_bytes;
mod framing;
mod identity;
mod lenient;
mod logic;
mod msg;
mod msg_rdma;
mod pf_rename;
mod rdma_identity;
mod rig;
mod socket;
mod store;
