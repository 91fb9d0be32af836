//! Plugins the runtime launches itself ("pre-installed").
//!
//! The runtime starts `<plugin_path>/NN-name` with a socketpair end as file
//! descriptor 3 and an environment of exactly these three variables
//! (`adaptation/plugin.go` `newLaunchedPlugin`); the plugin's drop-in
//! config arrives later in `ConfigureRequest.config`.

use std::{
    env,
    os::unix::{io::FromRawFd, net::UnixStream},
    sync::atomic::{AtomicBool, Ordering},
};

use super::StubError;

pub const ENV_PLUGIN_NAME: &str = "NRI_PLUGIN_NAME";
pub const ENV_PLUGIN_IDX: &str = "NRI_PLUGIN_IDX";
pub const ENV_PLUGIN_SOCKET: &str = "NRI_PLUGIN_SOCKET";

/// Set once the inherited descriptor has an owner, so that it never gets two.
static ADOPTED: AtomicBool = AtomicBool::new(false);

/// Identity and connection handed over by the runtime.
#[derive(Debug)]
pub struct Preinstalled {
    pub name: String,
    pub idx: String,
    pub stream: UnixStream,
}

impl Preinstalled {
    /// Whether the runtime launched this process: the test
    /// [`Preinstalled::from_env`] makes before it reads anything.
    pub fn launched() -> bool {
        env::var_os(ENV_PLUGIN_SOCKET).is_some()
    }

    /// `None` unless `NRI_PLUGIN_SOCKET` is set, i.e. unless the runtime
    /// launched this process. Takes ownership of the descriptor; a second
    /// call fails.
    pub fn from_env() -> Result<Option<Preinstalled>, StubError> {
        let Some(fd) = env::var_os(ENV_PLUGIN_SOCKET) else {
            return Ok(None);
        };
        let fd = fd
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
            .filter(|fd| *fd >= 0)
            .ok_or_else(|| StubError::Env {
                var: ENV_PLUGIN_SOCKET,
                problem: format!("{fd:?}, not a file descriptor number"),
            })?;
        let name = required(ENV_PLUGIN_NAME)?;
        let idx = required(ENV_PLUGIN_IDX)?;
        let stream = adopt_socket(fd)?;
        Ok(Some(Preinstalled { name, idx, stream }))
    }
}

fn required(var: &'static str) -> Result<String, StubError> {
    match env::var(var) {
        Ok(value) if !value.is_empty() => Ok(value),
        Ok(_) => Err(StubError::Env {
            var,
            problem: "empty".to_string(),
        }),
        Err(e) => Err(StubError::Env {
            var,
            problem: e.to_string(),
        }),
    }
}

/// Checks that `fd` is an open socket, marks it close-on-exec (children
/// such as hooks must not hold the runtime's connection open) and takes
/// ownership of it.
fn adopt_socket(fd: i32) -> Result<UnixStream, StubError> {
    let os_error = |fd| StubError::InheritedFd {
        fd,
        source: std::io::Error::last_os_error(),
    };
    // SAFETY: fstat only writes into the zeroed struct we pass; an invalid
    // descriptor makes it fail with EBADF.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(os_error(fd));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(StubError::InheritedFd {
            fd,
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a socket"),
        });
    }
    // SAFETY: plain fcntl on a descriptor just checked to be open.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(os_error(fd));
    }
    if ADOPTED.swap(true, Ordering::SeqCst) {
        return Err(StubError::InheritedFd {
            fd,
            source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, "already adopted"),
        });
    }
    // SAFETY: the runtime passed this open socket to this process for the
    // plugin connection and nothing else uses it; ADOPTED guarantees that
    // this is the only owner created in this process.
    Ok(unsafe { UnixStream::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use std::os::unix::io::IntoRawFd;

    use super::*;

    // One test: ADOPTED is process-wide, so the order of these steps matters.
    #[test]
    fn adopts_only_an_open_socket_and_only_once() {
        // Far above any descriptor limit, so never open.
        assert!(matches!(
            adopt_socket(i32::MAX),
            Err(StubError::InheritedFd { .. })
        ));

        let file = std::fs::File::open("/dev/null").unwrap();
        let err = adopt_socket(std::os::unix::io::AsRawFd::as_raw_fd(&file)).unwrap_err();
        assert!(err.to_string().contains("file descriptor"), "{err}");

        let (a, b) = UnixStream::pair().unwrap();
        let fd = a.into_raw_fd();
        let adopted = adopt_socket(fd).unwrap();
        // SAFETY: F_GETFD only reads the descriptor flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        assert!(matches!(
            adopt_socket(fd),
            Err(StubError::InheritedFd { .. })
        ));
        drop((adopted, b));
    }

    #[test]
    fn absent_socket_variable_means_not_preinstalled() {
        if env::var_os(ENV_PLUGIN_SOCKET).is_none() {
            assert!(Preinstalled::from_env().unwrap().is_none());
        }
    }
}
