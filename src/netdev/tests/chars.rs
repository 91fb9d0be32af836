//! An RDMA device's char devices read from a simulated host's sysfs, as the
//! attach reads them again after a move in exclusive mode.
use crate::fixture::HostRootBuilder;
use crate::netdev::{CharNum, NetEnv, NetnsRoots, SysNetEnv};

/// The HGX fixture's host root, and the real environment reading its sysfs.
fn hgx() -> (tempfile::TempDir, crate::fixture::Fixture, SysNetEnv) {
    let dir = tempfile::tempdir().unwrap();
    let fx = HostRootBuilder::hgx()
        .build(&dir.path().join("host"))
        .unwrap();
    let env = SysNetEnv::new(NetnsRoots::default())
        .unwrap()
        .with_sys_root(fx.root().join("sys"));
    (dir, fx, env)
}

#[test]
fn the_char_devices_of_an_rdma_device_are_read_from_sysfs() {
    let (_dir, fx, mut env) = hgx();
    let inv = fx.expected();
    let dev = inv.rdma[0].vfs[0].rdma.clone().unwrap();
    let mut want: Vec<CharNum> = dev
        .char_devs
        .iter()
        .map(|c| CharNum {
            name: c.name.clone(),
            major: c.dev.major,
            minor: c.dev.minor,
        })
        .collect();
    want.sort();
    assert!(!want.is_empty());
    assert_eq!(env.rdma_chars(&dev.name).unwrap(), want);
    assert!(env.rdma_chars("mlx5_999").unwrap().is_empty());
    // Renumbered: the new minor is what is read.
    let uverbs = want.iter().find(|c| c.name.starts_with("uverbs")).unwrap();
    let path = fx
        .root()
        .join("sys/class/infiniband_verbs")
        .join(&uverbs.name)
        .join("dev");
    std::fs::write(&path, format!("{}:{}\n", uverbs.major, uverbs.minor + 7)).unwrap();
    let now = env.rdma_chars(&dev.name).unwrap();
    let got = now.iter().find(|c| c.name == uverbs.name).unwrap();
    assert_eq!(got.minor, uverbs.minor + 7);
    // A malformed number is an error naming the file.
    std::fs::write(&path, "nonsense\n").unwrap();
    let e = env.rdma_chars(&dev.name).unwrap_err().to_string();
    assert!(
        e.contains("infiniband_verbs") && e.contains("no device number"),
        "{e}"
    );
}

/// A VF's PF is read from its `physfn` link in a simulated host's sysfs (laid
/// out as Linux does, the device directories reached through links); a
/// function with no such link has none.
#[test]
fn a_vfs_pf_is_read_from_its_physfn_link() {
    let (_dir, fx, mut env) = hgx();
    let inv = fx.expected();
    for nic in inv.rdma.iter().filter(|n| !n.vfs.is_empty()) {
        for vf in &nic.vfs {
            assert_eq!(env.vf_physfn(vf.bus_id).unwrap(), Some(nic.bus_id));
        }
        assert_eq!(env.vf_physfn(nic.bus_id).unwrap(), None, "a pf has no pf");
    }
    let absent = "0000:ff:1f.7".parse().unwrap();
    assert_eq!(env.vf_physfn(absent).unwrap(), None);
}

/// A function's RDMA devices are the entries of its `infiniband` directory in
/// a simulated host's sysfs; a function with none, or absent, has none.
#[test]
fn a_functions_rdma_devices_are_read_from_its_infiniband_directory() {
    let (_dir, fx, mut env) = hgx();
    let inv = fx.expected();
    let vf = &inv.rdma[0].vfs[0];
    let name = vf.rdma.as_ref().unwrap().name.clone();
    assert_eq!(env.vf_rdma(vf.bus_id).unwrap(), vec![name]);
    let gpu = inv.gpus[0].bus_id;
    assert!(env.vf_rdma(gpu).unwrap().is_empty(), "a gpu has none");
    let absent = "0000:ff:1f.7".parse().unwrap();
    assert!(env.vf_rdma(absent).unwrap().is_empty());
}
