//! An RDMA device's char devices read from a simulated host's sysfs, as the
//! attach reads them again after a move in exclusive mode.
use crate::fixture::HostRootBuilder;
use crate::netdev::{CharNum, NetEnv, NetnsRoots, SysNetEnv};

#[test]
fn the_char_devices_of_an_rdma_device_are_read_from_sysfs() {
    let dir = tempfile::tempdir().unwrap();
    let fx = HostRootBuilder::hgx()
        .build(&dir.path().join("host"))
        .unwrap();
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
    let mut env = SysNetEnv::new(NetnsRoots::default())
        .unwrap()
        .with_sys_root(fx.root().join("sys"));
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
