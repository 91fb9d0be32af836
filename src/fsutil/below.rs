//! Paths of another process's files, seen through its root directory
//! (`/proc/<pid>/root`) or a host root.

use std::fs;
use std::path::{Path, PathBuf};

/// `path` as seen from `root`, a process's root (`/proc/<pid>/root`) or a
/// host root: an absolute path is taken below it, as that process opens it.
pub fn below_root(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The kernel's bound on links followed in one lookup (`MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// Put after a link the walk leaves unfollowed: a name with a NUL, which no
/// path-taking call accepts (a C string ends there), so that the kernel
/// never follows the link from this process's root.
const UNFOLLOWED: &str = "\0unfollowed link";

/// [`below_root`] with the links on the way followed as the process whose
/// root `root` is follows them: an absolute link from `root`, where the
/// kernel, walking through `/proc/<pid>/root`, would take it from this
/// process's root (kubelet's `kubelet-client-current.pem` is such a link).
/// `..` stops at `root`. The walk ends at a component that is missing,
/// unreadable or not a directory with more to follow: the rest is joined as
/// written, so that opening the result fails as opening the path would. A
/// link it does not follow (past the kernel's bound, or unreadable) would be
/// followed by the kernel from this process's root, outside `root`: the
/// result then names nothing any call can open (a component holding a NUL,
/// which every path-taking call refuses), as the path fails for that process
/// (ELOOP). For looking, as doctor does, not for opening what a pod
/// controls: a link can change between this and the open (the hook opens
/// with `openat2`).
pub fn resolve_below_root(root: &Path, path: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    use std::path::Component;
    if root == Path::new("/") {
        return path.to_path_buf();
    }
    let pending = |p: &Path| -> Vec<std::ffi::OsString> {
        p.components()
            .rev()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .collect()
    };
    // Components still to walk, the next one last.
    let mut todo = pending(path);
    let mut done = PathBuf::new();
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            done.pop();
            continue;
        }
        let here = done.join(&name);
        let full = root.join(&here);
        let Ok(meta) = fs::symlink_metadata(&full) else {
            done = here;
            break;
        };
        if !meta.file_type().is_symlink() {
            done = here;
            if meta.is_dir() {
                continue;
            }
            break;
        }
        match fs::read_link(&full) {
            Ok(target) if links < MAX_LINKS => {
                links += 1;
                if target.is_absolute() {
                    done.clear();
                }
                todo.extend(pending(&target));
            }
            _ => {
                done = here;
                done.push(UNFOLLOWED);
                break;
            }
        }
    }
    // What the walk did not reach, as written.
    while let Some(name) = todo.pop() {
        done.push(name);
    }
    // A trailing `/` asks for a directory (path_resolution(7)): kept, so that
    // a file there fails with ENOTDIR as it would for that process.
    if path.as_os_str().as_bytes().ends_with(b"/") && !done.as_os_str().is_empty() {
        done.push("");
    }
    root.join(done)
}

/// [`resolve_below_root`] of `joined`, a path [`below_root`] made under
/// `root`; one not under it, as it is.
pub fn follow_below_root(root: &Path, joined: &Path) -> PathBuf {
    match joined.strip_prefix(root) {
        Ok(rel) if root != Path::new("/") => resolve_below_root(root, &Path::new("/").join(rel)),
        _ => joined.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A process's root holding kubelet's certificate behind the links a
    /// node has, and some that climb or loop; its temporary directory too.
    fn plugin_root() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let pki = root.join("var/lib/kubelet/pki");
        fs::create_dir_all(&pki).unwrap();
        fs::create_dir_all(root.join("run")).unwrap();
        fs::write(pki.join("client-2026.pem"), "cert").unwrap();
        fs::write(root.join("var/lib/other.pem"), "other").unwrap();
        let links = [
            (
                "/var/lib/kubelet/pki/client-2026.pem",
                "var/lib/kubelet/pki/current.pem",
            ),
            ("client-2026.pem", "var/lib/kubelet/pki/relative.pem"),
            // An absolute link to a directory, relative ones climbing, one past the root.
            ("/var/lib", "lib"),
            ("../../other.pem", "var/lib/kubelet/pki/up.pem"),
            ("../../../..", "var/up"),
            ("/var/loop", "var/loop"),
            ("/run", "var/run"),
        ];
        for (target, at) in links {
            symlink(target, root.join(at)).unwrap();
        }
        (tmp, root)
    }

    /// Links inside another process's root are followed as that process follows
    /// them: an absolute one from its root, a relative one from the link's
    /// directory, `..` never above the root; where the walk cannot go on (a
    /// missing component, a file with more to follow), the rest is left as
    /// written, and after a loop the result names nothing.
    #[test]
    fn links_below_a_root_are_followed_inside_it() {
        let (_tmp, root) = plugin_root();
        let client = "var/lib/kubelet/pki/client-2026.pem";
        let cases = [
            ("/var/lib/kubelet/pki/current.pem", client),
            ("/var/lib/kubelet/pki/relative.pem", client),
            ("/lib/kubelet/pki/current.pem", client),
            ("/../../var/lib/kubelet/pki/current.pem", client),
            ("/var/lib/../lib/kubelet/./pki/current.pem", client),
            // `..` after a link: the parent of where it led.
            ("/lib/../x", "var/x"),
            ("/var/lib/kubelet/pki/up.pem", "var/lib/other.pem"),
            ("/var/up/var/lib/kubelet/pki/current.pem", client),
            // Where the walk cannot go on, the rest as written.
            ("/var/lib/missing/x.pem", "var/lib/missing/x.pem"),
            ("/var/missing/../lib/x", "var/missing/../lib/x"),
            (
                "/var/lib/kubelet/pki/client-2026.pem/../x",
                "var/lib/kubelet/pki/client-2026.pem/../x",
            ),
            ("/var/loop/x", "var/loop/\0unfollowed link/x"),
        ];
        for (path, want) in cases {
            let got = resolve_below_root(&root, Path::new(path));
            assert_eq!(got, root.join(want), "{path}");
        }
        // A trailing `/` stays: a file there is not a directory.
        let slash = resolve_below_root(&root, Path::new("/var/lib/kubelet/pki/current.pem/"));
        assert_eq!(slash, root.join(format!("{client}/")));
        let err = fs::read_dir(&slash).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{err}");
        assert!(fs::metadata(&slash).is_err());
        assert_eq!(
            resolve_below_root(&root, Path::new("/lib/")),
            root.join("var/lib/")
        );
        let current = resolve_below_root(&root, Path::new("/lib/kubelet/pki/current.pem"));
        assert_eq!(fs::read_to_string(current).unwrap(), "cert");
        // This process's own root: the path as it is, left to the kernel.
        let own = Path::new("/var/lib/kubelet/pki/current.pem");
        assert_eq!(resolve_below_root(Path::new("/"), own), own);
    }

    /// A chain of links longer than the kernel follows, whose last link
    /// leads out of the root, never reads what lies outside: the walk stops
    /// where the kernel would fail (ELOOP).
    #[test]
    fn a_chain_past_the_kernels_bound_names_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, outside) = (tmp.path().join("root"), tmp.path().join("outside"));
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("secret"), "x").unwrap();
        for n in 0..=MAX_LINKS {
            symlink(format!("l{}", n + 1), root.join(format!("l{n}"))).unwrap();
        }
        let last = root.join(format!("l{}", MAX_LINKS + 1));
        symlink(&outside, last).unwrap();
        let got = resolve_below_root(&root, Path::new("/l0/secret"));
        assert!(got.starts_with(&root), "{got:?}");
        let err = fs::read(&got).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
        assert!(!got.exists());
        // Within the bound, the chain is followed to its end, inside the root.
        let short = resolve_below_root(&root, Path::new(&format!("/l{}/secret", MAX_LINKS - 2)));
        assert_eq!(
            short,
            root.join(outside.strip_prefix("/").unwrap()).join("secret")
        );
    }

    /// A path joined under the root is followed there; one outside it, and
    /// every path of this process's own root, are left as they are.
    #[test]
    fn only_paths_under_a_root_other_than_slash_are_followed() {
        let (tmp, root) = plugin_root();
        assert_eq!(
            follow_below_root(&root, &root.join("var/run/token")),
            root.join("run/token")
        );
        let outside = tmp.path().join("var/run/token");
        assert_eq!(follow_below_root(&root, &outside), outside);
        let own = Path::new("/var/run/token");
        assert_eq!(follow_below_root(Path::new("/"), own), own);
    }
}
