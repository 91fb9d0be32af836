//! Which processes a pod's cgroups take in, and how they are kept.
use super::*;

const UID: &str = "6b2c1f0e-1a2b-4c3d-8e9f-001122334455";

#[test]
fn nri_paths_match_by_prefix_and_slice() {
    let table = [
        (
            "/kubepods/burstable/podX",
            "4:pids:/kubepods/burstable/podX/abc\n",
            true,
        ),
        (
            "/kubepods/burstable/podX",
            "0::/kubepods/burstable/podX\n",
            true,
        ),
        (
            "/kubepods/burstable/podX",
            "0::/kubepods/burstable/podXY/abc\n",
            false,
        ),
        (
            "/kubepods/burstable/podX/",
            "0::/kubepods/burstable/podX/c\n",
            true,
        ),
        (
            "kubepods-pod1.slice:cri-containerd:abc",
            "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n",
            true,
        ),
        (
            "kubepods-pod1.slice",
            "0::/kubepods.slice/kubepods-pod12.slice\n",
            false,
        ),
        ("/", "0::/anything\n", false),
        // Levels that hold many pods are never taken for one.
        (
            "kubepods-besteffort.slice",
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod2.slice/c.scope\n",
            false,
        ),
        (
            "/kubepods/burstable",
            "4:pids:/kubepods/burstable/podY/abc\n",
            false,
        ),
        (
            "system.slice:cri-containerd:abc",
            "0::/system.slice/x.service\n",
            false,
        ),
        ("", "0::/\n", false),
    ];
    for (nri, proc_cgroup, want) in table {
        let pod = PodCgroups::from_paths(&[nri]);
        assert_eq!(pod.contains(proc_cgroup), want, "{nri} vs {proc_cgroup}");
    }
}

#[test]
fn merging_keeps_each_pattern_once_and_ignoring_takes_any_level() {
    let paths = [
        "/kubepods/burstable/podX",
        "kubepods-pod1.slice:cri-containerd:a",
    ];
    let once = PodCgroups::from_paths(&paths);
    let twice = once.clone().merged(PodCgroups::from_paths(&paths));
    assert_eq!(twice, once);
    let ignored = PodCgroups::ignoring(&["system.slice"]);
    assert!(ignored.ignores("0::/system.slice/nvidia-persistenced.service\n"));
}

#[test]
fn daemon_entries_take_in_a_kubelet_pod_only_when_they_lie_within_them() {
    let ignored = PodCgroups::ignoring(&[
        "/k8s",
        "/k8s.slice",
        "nvidia-dcgm.service",
        "/kubepods/burstable/podstatic",
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podstatic2.slice",
        // A unit name never applies within the pods (the config refuses
        // this one), whatever it names.
        "kubepods-burstable-podunit.slice",
    ]);
    for (proc_cgroup, want) in [
        ("0::/k8s/system.slice/exporter.service\n", true),
        ("0::/k8s.slice/k8s-system.slice/exporter.service\n", true),
        ("0::/system.slice/nvidia-dcgm.service\n", true),
        // kubelet's pods under `--cgroup-root=/k8s`, either driver.
        ("0::/k8s/kubepods/besteffort/podX/c1\n", false),
        ("0::/k8s.slice/k8s-kubepods.slice/k8s-kubepods-burstable.slice/k8s-kubepods-burstable-podX.slice/cri-containerd-a.scope\n", false),
        // A pod's cgroup carrying a daemon's unit name.
        ("0::/kubepods/podX/c1/nvidia-dcgm.service\n", false),
        ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podX.slice/nvidia-dcgm.service\n", false),
        // Entries naming a pod's own cgroup (a static daemon pod), by path.
        ("0::/kubepods/burstable/podstatic/c1\n", true),
        ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podstatic2.slice/crio-a.scope\n", true),
        ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podunit.slice/crio-a.scope\n", false),
        // A tenant's own cgroup named like the static pod's is no prefix of it.
        ("0::/kubepods/podX/c1/kubepods/burstable/podstatic\n", false),
        // Every hierarchy of cgroup v1 is looked at, and one within the pods
        // places the process there for all.
        ("4:devices:/k8s/kubepods/podX/c1\n1:name=systemd:/k8s/kubepods/podX/c1\n", false),
        ("4:devices:/k8s/kubepods/podX/c1\n0::/k8s/other\n", false),
        ("4:devices:/k8s/other/a\n", true),
    ] {
        assert_eq!(ignored.ignores(proc_cgroup), want, "{proc_cgroup}");
    }
}

#[test]
fn a_pod_keeps_its_own_cgroups_not_one_per_container() {
    let parent = "/kubepods/burstable/podX";
    let mut pod = PodCgroups::from_paths(&[parent]);
    for n in 0..1000 {
        let ctr = format!("{parent}/{n:064x}");
        pod = pod.merged(PodCgroups::from_paths(&[parent, ctr.as_str()]));
    }
    assert_eq!(pod, PodCgroups::from_paths(&[parent]));
    assert!(pod.contains("0::/kubepods/burstable/podX/0000ab\n"));

    // A wider path given later takes the narrower ones' place; what
    // matches stays the same.
    let narrow = PodCgroups::from_paths(&[
        "/kubepods/besteffort/podY/c1",
        "/kubepods/besteffort/podY/c2",
    ]);
    let wide = narrow
        .clone()
        .merged(PodCgroups::from_paths(&["/kubepods/besteffort/podY"]));
    assert_eq!(wide, PodCgroups::from_paths(&["/kubepods/besteffort/podY"]));
    assert!(narrow.contains("0::/kubepods/besteffort/podY/c1/x\n"));
    assert!(wide.contains("0::/kubepods/besteffort/podY/c1/x\n"));

    // A slice takes in a cgroupfs-style path through it; a sibling with a
    // common text prefix is not taken in.
    let slice = PodCgroups::from_paths(&["kubepods-pod1.slice:cri-containerd:a"]);
    let through = slice.clone().merged(PodCgroups::from_paths(&[
        "/kubepods.slice/kubepods-pod1.slice/x.scope",
    ]));
    assert_eq!(through, slice);
    let siblings =
        PodCgroups::from_paths(&["/kubepods/burstable/podX", "/kubepods/burstable/podXY"]);
    assert!(siblings.contains("0::/kubepods/burstable/podXY\n"));
    assert!(siblings.contains("0::/kubepods/burstable/podX\n"));
}

/// Containers beside the sandbox (no pod cgroup): each removed one's
/// path goes, the pod's own stay, and so does a systemd slice; a path
/// that does not name the container as its last part is not its own.
#[test]
fn a_removed_containers_own_cgroup_is_forgotten() {
    let sandbox = "/k8s.io/5a4d";
    let own = PodCgroups::from_paths(&[sandbox]);
    let mut pod = own.clone();
    for n in 0..100 {
        let id = format!("{n:064x}");
        let ctr = format!("/k8s.io/{id}");
        pod = pod.merged(PodCgroups::from_paths(&[ctr.as_str()]));
        assert!(pod.contains(&format!("0::{ctr}\n")));
        pod.forget_container(&ctr, &id, &own);
        assert!(!pod.contains(&format!("0::{ctr}\n")));
    }
    assert_eq!(pod, own);
    let id = "c0ffee00c0ffee00c0ffee00";
    // The sandbox's own path is the pod's, whatever container names it.
    pod.forget_container(sandbox, "5a4d", &own);
    pod.forget_container(&format!("/k8s.io/{id}/../5a4d"), id, &own);
    assert_eq!(pod, own);
    // A path shared with others, or above them, names no container.
    let shared = "/k8s.io/shared";
    let mut with_shared = own.clone().merged(PodCgroups::from_paths(&[shared]));
    let before = with_shared.clone();
    with_shared.forget_container(shared, id, &own);
    with_shared.forget_container(&format!("/k8s.io/{id}"), "short", &own);
    assert_eq!(with_shared, before);
    // A container path that took the sandbox's in: the sandbox's is kept.
    let odd = PodCgroups::from_paths(&[format!("/k8s.io/{id}/5a4d").as_str()]);
    let mut above = odd.clone();
    above = above.merged(PodCgroups::from_paths(&[format!("/k8s.io/{id}").as_str()]));
    above.forget_container(&format!("/k8s.io/{id}"), id, &odd);
    assert_eq!(above, odd);
    // A container beneath the pod's cgroup was never added; forgetting
    // it keeps the pod's.
    let parent = PodCgroups::from_paths(&["/kubepods/besteffort/podA"]);
    let mut nested = parent.clone();
    nested.forget_container(&format!("/kubepods/besteffort/podA/{id}"), id, &parent);
    assert_eq!(nested, parent);
    // systemd: the container's path names the pod's slice.
    let slice = format!("kubepods-besteffort-podA.slice:cri-containerd:{id}");
    let systemd = PodCgroups::from_paths(&["kubepods-besteffort-podA.slice"]);
    let mut kept = systemd.clone();
    kept.forget_container(&slice, id, &PodCgroups::none());
    assert_eq!(kept, systemd);
}

#[test]
fn uid_matches_both_cgroup_drivers() {
    let pod = PodCgroups::from_uid(UID);
    let cgroupfs = format!("9:memory:/kubepods/besteffort/pod{UID}/ctr\n0::/\n");
    let systemd = format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/x.scope\n",
        UID.replace('-', "_")
    );
    assert!(pod.contains(&cgroupfs));
    assert!(pod.contains(&systemd));
    // Under kubelet's --cgroup-root=/k8s, both drivers.
    let slice_uid = UID.replace('-', "_");
    let rooted = [
        format!("0::/k8s.slice/k8s-kubepods.slice/k8s-kubepods-burstable.slice/k8s-kubepods-burstable-pod{slice_uid}.slice/cri-containerd-x.scope\n"),
        format!("0::/k8s.slice/k8s-kubepods.slice/k8s-kubepods-pod{slice_uid}.slice/x.scope\n"),
        format!("0::/k8s/kubepods/burstable/pod{UID}/ctr\n"),
    ];
    for text in rooted {
        assert!(pod.contains(&text), "{text}");
    }
    // Another pod's, whose UID ends like this one's.
    let other = format!("0::/kubepods.slice/kubepods-pod1{slice_uid}.slice/x.scope\n");
    assert!(!pod.contains(&other));
    // Its name after something not a root's names.
    let glued = format!("0::/x.slice/xkubepods-pod{slice_uid}.slice/x.scope\n");
    assert!(!pod.contains(&glued));
    assert!(!pod.contains("0::/system.slice/containerd.service\n"));
    assert!(PodCgroups::from_uid("").is_empty());
    assert!(PodCgroups::from_uid("../x").is_empty());
}

#[test]
fn narrowed_to_containers_matches_their_cgroups_only() {
    let id = "c0ffee00c0ffee00c0ffee00";
    let other = "beef0000beef0000beef0000";
    let pod = PodCgroups::from_uid(UID).only_containers(&[id, "short", "../x"]);
    let slice = format!(
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        UID.replace('-', "_")
    );
    let table = [
        (format!("0::/kubepods/besteffort/pod{UID}/{id}\n"), true),
        (
            format!("0::/kubepods/besteffort/pod{UID}/{id}/nested\n"),
            true,
        ),
        (format!("{slice}/cri-containerd-{id}.scope\n"), true),
        (format!("{slice}/crio-{id}.scope\n"), true),
        (format!("0::/kubepods/besteffort/pod{UID}/{other}\n"), false),
        (format!("{slice}/cri-containerd-{other}.scope\n"), false),
        // Ids shorter than a runtime's name nothing.
        (format!("0::/kubepods/besteffort/pod{UID}/short\n"), false),
        // The container's id outside the pod's cgroup.
        (format!("0::/system.slice/{id}\n"), false),
    ];
    for (text, want) in table {
        assert_eq!(pod.contains(&text), want, "{text}");
    }
    let nothing = PodCgroups::from_uid(UID).only_containers::<&str>(&[]);
    assert!(!nothing.contains(&format!("0::/kubepods/besteffort/pod{UID}/{id}\n")));
}
