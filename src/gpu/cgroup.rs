//! Which processes belong to a pod, judged from `/proc/<pid>/cgroup` (cgroups(7): one
//! `hierarchy-id:controllers:path` line per hierarchy; v2 is `0::path`).
//!
//! A pod is known by what NRI says (PodSandbox `linux.cgroup_parent`, container
//! `linux.cgroups_path`) or, after a restart, by its UID as kubelet names its cgroups:
//! `/kubepods/<qos>/pod<uid>` with the cgroupfs driver and
//! `kubepods-<qos>-pod<uid with _ for ->.slice` with the systemd driver
//! (kubelet `pkg/kubelet/cm/cgroup_manager_linux.go`).

/// One way a cgroup path can place a process in the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// An absolute path: the process path equals it or lies beneath it.
    Prefix(String),
    /// A single path component, e.g. a systemd slice name: it occurs in the path.
    Component(String),
    /// A pod's systemd slice as kubelet names it under the default cgroup
    /// root (`kubepods-burstable-pod<uid>.slice`): a component that is it,
    /// or that ends in it after the names of another root (`--cgroup-root=/k8s`:
    /// `k8s-kubepods-burstable-pod<uid>.slice`, `CgroupName.ToSystemd`).
    PodSlice(String),
}

/// The cgroups of one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodCgroups {
    patterns: Vec<Pattern>,
    /// When set, only processes in these containers' cgroups are the pod's
    /// (see [`PodCgroups::only_containers`]).
    containers: Option<Vec<String>>,
}

/// The shortest container id taken as a cgroup name's part: runtimes name
/// containers by 64 hex digits (12 in Docker's short form), and a shorter
/// text could occur by chance in another container's cgroup name.
const MIN_CONTAINER_ID: usize = 12;

impl PodCgroups {
    /// No process belongs: every user of a released GPU is an outsider.
    pub fn none() -> PodCgroups {
        PodCgroups::default()
    }

    /// From NRI paths. Accepted forms: `/kubepods/burstable/pod<uid>` (cgroupfs),
    /// `kubepods-burstable-pod<uid>.slice` (a systemd slice) and
    /// `<slice>:<prefix>:<name>` (systemd `cgroups_path` of a container; its slice is
    /// the pod's).
    /// A path naming a cgroup that holds more than one pod (a QoS level such
    /// as `kubepods-besteffort.slice`, which a CRI client other than kubelet
    /// may give as a sandbox's parent) is left out: it would take other
    /// tenants' processes for the pod's, to be killed.
    pub fn from_paths<S: AsRef<str>>(paths: &[S]) -> PodCgroups {
        let mut patterns = Vec::new();
        for p in paths.iter().filter_map(|p| pattern(p.as_ref())) {
            if !p.is_shared_level() {
                add(&mut patterns, p);
            }
        }
        PodCgroups {
            patterns,
            containers: None,
        }
    }

    /// Node daemons' cgroups (`gpu.ignored_cgroups`): unit names or path
    /// prefixes, any level; see [`PodCgroups::ignores`] for a process within
    /// kubelet's pods.
    pub fn ignoring<S: AsRef<str>>(paths: &[S]) -> PodCgroups {
        let patterns = paths.iter().filter_map(|p| pattern(p.as_ref())).collect();
        PodCgroups {
            patterns,
            containers: None,
        }
    }

    /// From the pod UID, for pods released when NRI's paths are no longer known.
    pub fn from_uid(uid: &str) -> PodCgroups {
        let uid = uid.trim();
        if uid.is_empty() || uid.contains('/') {
            return PodCgroups::none();
        }
        let mut patterns = vec![Pattern::Component(format!("pod{uid}"))];
        let slice_uid = uid.replace('-', "_");
        for qos in ["", "besteffort-", "burstable-"] {
            patterns.push(Pattern::PodSlice(format!(
                "kubepods-{qos}pod{slice_uid}.slice"
            )));
        }
        PodCgroups {
            patterns,
            containers: None,
        }
    }

    /// Narrows the pod to the processes of the given containers (and sandbox):
    /// those whose cgroup path has a part naming one of them, as both drivers
    /// name a container's cgroup (`pod<uid>/<id>`, `cri-containerd-<id>.scope`,
    /// `crio-<id>.scope`). For a sandbox that kubelet recreated: the new
    /// sandbox's containers run in the same pod cgroup under the same UID, and
    /// releasing the old sandbox must not take them for its leftovers. Ids
    /// shorter than [`MIN_CONTAINER_ID`] name nothing.
    pub fn only_containers<S: AsRef<str>>(mut self, ids: &[S]) -> PodCgroups {
        let ids = ids
            .iter()
            .map(|id| id.as_ref().trim())
            .filter(|id| id.len() >= MIN_CONTAINER_ID && !id.contains('/'))
            .map(str::to_string)
            .collect();
        self.containers = Some(ids);
        self
    }

    /// Both sets of patterns, none taken in by another: every container of a
    /// pod brings its own cgroup path beneath the pod's (cgroupfs driver:
    /// `/kubepods/<qos>/pod<uid>/<container id>`), and a container restarting
    /// in a loop brings a new one each time, so the list stays as long as the
    /// pod's distinct cgroups, not its containers. `self`'s narrowing, if
    /// any, is kept: narrow once all paths are merged.
    pub fn merged(mut self, other: PodCgroups) -> PodCgroups {
        for p in other.patterns {
            add(&mut self.patterns, p);
        }
        self
    }

    /// Drops a removed container's own cgroup (`path`, a cgroupfs path whose
    /// last part names the container `id`), unless `pod`, the pod's own
    /// paths, takes it in: runc deletes a container's cgroup with it, and a
    /// CRI client that places containers beside the sandbox instead of
    /// beneath a pod cgroup (no `cgroup_parent`: `/k8s.io/<id>`) would
    /// otherwise leave one pattern for every container the pod ever ran. A
    /// path naming no container of its own (shared, or an ancestor) and a
    /// systemd slice, the pod's, stay. A process that outlived its
    /// container in that cgroup is then no longer the pod's: its GPU is
    /// quarantined at the release rather than the process ended.
    pub fn forget_container(&mut self, path: &str, id: &str, pod: &PodCgroups) {
        let Some(own @ Pattern::Prefix(_)) = pattern(path) else {
            return;
        };
        let id = id.trim();
        let names_it = |p: &str| p.rsplit('/').next().is_some_and(|last| last.contains(id));
        if id.len() < MIN_CONTAINER_ID || id.contains('/') || !names_it(path.trim()) {
            return;
        }
        if pod.patterns.iter().any(|p| p.takes_in(&own)) {
            return;
        }
        self.patterns.retain(|p| *p != own);
        // A pod path the container's took in (an odd layout) is the pod's again.
        for p in &pod.patterns {
            add(&mut self.patterns, p.clone());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether no process can belong: no pattern, or narrowed to no container.
    pub fn names_nothing(&self) -> bool {
        self.is_empty() || self.containers.as_ref().is_some_and(Vec::is_empty)
    }

    /// Whether any hierarchy in a `/proc/<pid>/cgroup` text places the process in the pod.
    pub fn contains(&self, proc_cgroup: &str) -> bool {
        hierarchy_paths(proc_cgroup)
            .any(|path| self.patterns.iter().any(|p| matches(p, path)) && self.in_containers(path))
    }

    /// Whether node daemons' entries ([`PodCgroups::ignoring`]) take in the
    /// process. A process any of whose hierarchies places it within
    /// kubelet's pods is taken in only by a path lying there itself (a
    /// static daemon pod's, for hooks-only nodes, where `gpu.ignored_pods`
    /// cannot apply): a prefix above the pods (`/k8s` under kubelet's
    /// `--cgroup-root=/k8s`), or a unit name, which a pod may give a cgroup
    /// of its own, must not hide a pod's holder of a released GPU.
    pub fn ignores(&self, proc_cgroup: &str) -> bool {
        let in_pods = hierarchy_paths(proc_cgroup).any(in_kubelet_pods);
        let applies = |p: &&Pattern| match p {
            Pattern::Prefix(prefix) => !in_pods || in_kubelet_pods(prefix),
            Pattern::Component(_) | Pattern::PodSlice(_) => !in_pods,
        };
        hierarchy_paths(proc_cgroup).any(|path| {
            self.patterns
                .iter()
                .filter(applies)
                .any(|p| matches(p, path))
        })
    }

    fn in_containers(&self, path: &str) -> bool {
        let Some(ids) = &self.containers else {
            return true;
        };
        path.split('/')
            .any(|part| ids.iter().any(|id| part.contains(id.as_str())))
    }
}

/// The path of each hierarchy in a `/proc/<pid>/cgroup` text
/// (`hierarchy-ID:controllers:path`, cgroups(7)).
fn hierarchy_paths(proc_cgroup: &str) -> impl Iterator<Item = &str> {
    proc_cgroup
        .lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
}

/// Cgroups above pod level: kubelet's QoS levels under the cgroupfs driver
/// and systemd's top slices (the systemd driver's QoS slices are
/// [`is_qos_slice`]).
const SHARED_LEVELS: &[&str] = &[
    "kubepods",
    "besteffort",
    "burstable",
    "system.slice",
    "user.slice",
    "machine.slice",
];

/// A slice of the systemd driver's above the pods: `kubepods.slice` and its
/// QoS slices, `kubepods-besteffort.slice`, `kubepods-burstable.slice`, and
/// the same under a `--cgroup-root`, whose names kubelet puts before theirs
/// (`k8s-kubepods-burstable.slice`).
fn is_qos_slice(name: &str) -> bool {
    let Some(unit) = name.strip_suffix(".slice") else {
        return false;
    };
    // The last names, read from the end: no list made at each pod path.
    let mut names = unit.rsplit('-');
    matches!(
        (names.next(), names.next()),
        (Some("kubepods"), _) | (Some("besteffort" | "burstable"), Some("kubepods"))
    )
}

impl Pattern {
    fn is_shared_level(&self) -> bool {
        let last = match self {
            Pattern::Prefix(path) => path.rsplit('/').next().unwrap_or_default(),
            Pattern::Component(name) | Pattern::PodSlice(name) => name,
        };
        SHARED_LEVELS.contains(&last) || is_qos_slice(last)
    }
}

/// Why `entry` of `gpu.ignored_cgroups` cannot stand, if it cannot: one that
/// would be dropped (no unit name, no absolute path), one naming a level
/// every pod or service sits under, which would hide every tenant's
/// processes from the teardown, or a unit name within kubelet's pods, which
/// would never apply.
pub fn ignored_cgroup_problem(entry: &str) -> Option<&'static str> {
    match pattern(entry) {
        None => {
            Some("not a unit name (a.service, a.slice) or an absolute cgroup path other than /")
        }
        Some(p) if p.is_shared_level() => Some("a level every pod or service is under"),
        // See `PodCgroups::ignores`: a pod may name a cgroup of its own so.
        Some(Pattern::Component(name)) if in_kubelet_pods(&name) => {
            Some("a pod's slice by name, which never applies: give its absolute path")
        }
        Some(_) => None,
    }
}

/// Whether a cgroup path lies within kubelet's pods: a `kubepods` level
/// under the cgroupfs driver (`<cgroup-root>/kubepods/...`), or a slice of the
/// systemd driver's with `kubepods` among its dash-separated names (kubelet's
/// `CgroupName.ToSystemd` joins the whole path: `kubepods-burstable-pod<uid>.slice`,
/// and under `--cgroup-root=/k8s` `k8s-kubepods-burstable-pod<uid>.slice`).
fn in_kubelet_pods(path: &str) -> bool {
    path.split('/').any(|c| {
        c == "kubepods"
            || c.strip_suffix(".slice")
                .is_some_and(|unit| unit.split('-').any(|name| name == "kubepods"))
    })
}

fn pattern(path: &str) -> Option<Pattern> {
    let path = path.trim();
    if path.starts_with('/') {
        // The root (`/`, `//`) would take in every process on the node.
        let prefix = path.trim_end_matches('/');
        return (!prefix.is_empty()).then(|| Pattern::Prefix(prefix.to_string()));
    }
    if path.is_empty() {
        return None;
    }
    // systemd `slice:prefix:name`: the slice holds the whole pod.
    let slice = path.split(':').next().unwrap_or(path);
    if slice.is_empty() || slice.contains('/') || slice == "-.slice" {
        return None;
    }
    Some(Pattern::Component(slice.to_string()))
}

/// Adds `new` unless a pattern there already matches every path it does,
/// and drops those that `new` takes in.
fn add(patterns: &mut Vec<Pattern>, new: Pattern) {
    if patterns.iter().any(|p| p.takes_in(&new)) {
        return;
    }
    patterns.retain(|p| !new.takes_in(p));
    patterns.push(new);
}

impl Pattern {
    /// True only where every path `other` matches, `self` matches too (not
    /// every such pair is found: a prefix is never said to take in a unit
    /// name, which then stays beside it).
    fn takes_in(&self, other: &Pattern) -> bool {
        match other {
            // A path beneath a prefix has the prefix's components.
            Pattern::Prefix(prefix) => matches(self, prefix),
            Pattern::Component(_) | Pattern::PodSlice(_) => self == other,
        }
    }
}

fn matches(pattern: &Pattern, path: &str) -> bool {
    match pattern {
        Pattern::Prefix(prefix) => path
            .strip_prefix(prefix.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')),
        Pattern::Component(name) => path.split('/').any(|c| c == name),
        Pattern::PodSlice(name) => path.split('/').any(|c| {
            c.strip_suffix(name.as_str())
                .is_some_and(|root| root.is_empty() || root.ends_with('-'))
        }),
    }
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
