//! RDMA netlink (NETLINK_RDMA), built by hand: no crate covers the NLDEV SET
//! with a namespace fd. Numbers are include/uapi/rdma/rdma_netlink.h; the
//! message shapes match iproute2's `rdma dev set <dev> netns <ns>` and
//! vishvananda/netlink `rdma_link_linux.go`.

use super::netns::Netns;
use super::nl::{attrs, nla, Conn, Kind, NlError, NlSocket, Transport};

/// `RDMA_NL_NLDEV`: the client id in the upper bits of nlmsg_type.
const RDMA_NL_NLDEV: u16 = 5;
const RDMA_NLDEV_CMD_GET: u16 = 1;
const RDMA_NLDEV_CMD_SET: u16 = 2;
const RDMA_NLDEV_CMD_SYS_GET: u16 = 6;
pub const RDMA_NLDEV_ATTR_DEV_INDEX: u16 = 1;
pub const RDMA_NLDEV_ATTR_DEV_NAME: u16 = 2;
pub const RDMA_NLDEV_SYS_ATTR_NETNS_MODE: u16 = 66;
pub const RDMA_NLDEV_NET_NS_FD: u16 = 68;

/// `RDMA_NL_GET_TYPE(client, op)`.
pub fn nldev_type(op: u16) -> u16 {
    (RDMA_NL_NLDEV << 10) | op
}

/// The kernel's RDMA namespace mode (`rdma system show netns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetnsMode {
    /// Each device lives in one namespace and must be moved (ib_core netns_mode=0).
    Exclusive,
    /// Every device is visible in every namespace (the default).
    Shared,
}

/// RDMA device operations, in one namespace.
pub trait RdmaNl {
    /// Every device visible in this namespace, as `(index, name)`.
    fn devices(&mut self) -> Result<Vec<(u32, String)>, NlError>;
    fn set_netns(&mut self, index: u32, netns: &Netns) -> Result<(), NlError>;
    /// Names device `index` `name`. Names are unique across namespaces
    /// (`ib_device_rename` looks the new one up among every device), so a
    /// name held anywhere is refused with EEXIST.
    fn rename(&mut self, index: u32, name: &str) -> Result<(), NlError>;
    fn netns_mode(&mut self) -> Result<NetnsMode, NlError>;

    /// The device index of `name`, `None` if it is not visible in this namespace.
    fn dev_index(&mut self, name: &str) -> Result<Option<u32>, NlError> {
        Ok(self
            .devices()?
            .into_iter()
            .find(|(_, n)| n == name)
            .map(|(i, _)| i))
    }

    /// The name device `index` has now, `None` if it is not visible in this
    /// namespace. The kernel gives each device an index of its own for its
    /// whole life (`assign_name`: `xa_alloc_cyclic`), through renames and
    /// moves, so it names the device where its name may not.
    fn dev_name(&mut self, index: u32) -> Result<Option<String>, NlError> {
        Ok(self
            .devices()?
            .into_iter()
            .find(|(i, _)| *i == index)
            .map(|(_, n)| n))
    }
}

pub struct RdmaConn<T> {
    conn: Conn<T>,
}

impl RdmaConn<NlSocket> {
    /// A socket in the calling thread's namespace; it sees only that
    /// namespace's devices in exclusive mode (dranet PR #180).
    pub fn open() -> Result<Self, NlError> {
        Ok(RdmaConn::new(NlSocket::open(
            netlink_sys::constants::NETLINK_RDMA,
        )?))
    }
}

/// SET: `DEV_INDEX` u32 + `NET_NS_FD` u32 (nldev_set_doit → ib_device_set_netns_put).
pub fn set_netns_payload(index: u32, netns_fd: u32) -> Vec<u8> {
    let mut out = nla(RDMA_NLDEV_ATTR_DEV_INDEX, &index.to_ne_bytes());
    out.extend(nla(RDMA_NLDEV_NET_NS_FD, &netns_fd.to_ne_bytes()));
    out
}

/// SET: `DEV_INDEX` u32 + `DEV_NAME` NUL-terminated, as iproute2's
/// `rdma dev set <dev> name <name>` (nldev_set_doit → ib_device_rename).
pub fn rename_payload(index: u32, name: &str) -> Vec<u8> {
    let mut out = nla(RDMA_NLDEV_ATTR_DEV_INDEX, &index.to_ne_bytes());
    let mut strz = name.as_bytes().to_vec();
    strz.push(0);
    out.extend(nla(RDMA_NLDEV_ATTR_DEV_NAME, &strz));
    out
}

/// Reads `(index, name)` from one GET reply.
pub fn parse_dev(payload: &[u8]) -> Option<(u32, String)> {
    let mut index = None;
    let mut name = None;
    for (kind, value) in attrs(payload) {
        match kind {
            RDMA_NLDEV_ATTR_DEV_INDEX if value.len() >= 4 => {
                index = Some(u32::from_ne_bytes([value[0], value[1], value[2], value[3]]));
            }
            // `ib_device_rename` takes any bytes, and a pod with NET_ADMIN
            // names its device as it likes: a name that is not UTF-8 is
            // read lossily (U+FFFD, which no name devgate sets or looks up
            // holds), so the device is still listed by its index and renamed
            // back, never lost.
            RDMA_NLDEV_ATTR_DEV_NAME => {
                let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
                name = Some(String::from_utf8_lossy(&value[..end]).into_owned());
            }
            _ => {}
        }
    }
    Some((index?, name?))
}

impl<T: Transport> RdmaConn<T> {
    pub fn new(transport: T) -> Self {
        RdmaConn {
            conn: Conn::new(transport),
        }
    }

    pub fn transport(&self) -> &T {
        self.conn.transport()
    }
}

impl<T: Transport> RdmaNl for RdmaConn<T> {
    fn devices(&mut self) -> Result<Vec<(u32, String)>, NlError> {
        // A dump, as iproute2 lists them: nldev_get_doit answers one index
        // and errs for one not visible here.
        let replies = self.conn.request(
            "list rdma devices",
            nldev_type(RDMA_NLDEV_CMD_GET),
            Kind::Dump,
            &[],
        )?;
        Ok(replies.iter().filter_map(|p| parse_dev(p)).collect())
    }

    fn rename(&mut self, index: u32, name: &str) -> Result<(), NlError> {
        self.conn
            .request(
                "rename rdma device",
                nldev_type(RDMA_NLDEV_CMD_SET),
                Kind::Do,
                &rename_payload(index, name),
            )
            .map(drop)
    }

    fn set_netns(&mut self, index: u32, netns: &Netns) -> Result<(), NlError> {
        let fd = std::os::fd::AsRawFd::as_raw_fd(netns) as u32;
        let payload = set_netns_payload(index, fd);
        self.conn
            .request(
                "move rdma device",
                nldev_type(RDMA_NLDEV_CMD_SET),
                Kind::Do,
                &payload,
            )
            .map(drop)
    }

    fn netns_mode(&mut self) -> Result<NetnsMode, NlError> {
        let op = "read rdma netns mode";
        let replies = self
            .conn
            .request(op, nldev_type(RDMA_NLDEV_CMD_SYS_GET), Kind::Do, &[])?;
        let mode = replies
            .iter()
            .flat_map(|p| attrs(p))
            .find(|(k, v)| *k == RDMA_NLDEV_SYS_ATTR_NETNS_MODE && !v.is_empty())
            .map(|(_, v)| v[0])
            .ok_or_else(|| NlError::Malformed {
                op,
                reason: "no RDMA_NLDEV_SYS_ATTR_NETNS_MODE".to_string(),
            })?;
        // rdma_netlink.h: 0 = exclusive, 1 = shared.
        Ok(if mode == 0 {
            NetnsMode::Exclusive
        } else {
            NetnsMode::Shared
        })
    }
}
