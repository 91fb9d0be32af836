//! CDI device mode: the adjustment names the pod's devices by their CDI
//! names where the runtime injects CDI devices, and gives device nodes where
//! it does not.
use super::*;

/// `device_mode = "cdi"` on a runtime that injects CDI devices: the adjustment
/// names every device of the pod by its CDI name (GPU by UUID, VF by PCI
/// address) and carries no device node of its own.
#[test]
fn cdi_mode_names_gpus_and_vfs() {
    let node = node();
    let specs = node.dir.path().join("cdi");
    let config = Arc::new(Config {
        device_mode: config::DeviceMode::Cdi,
        cdi_spec_dirs: vec![specs.clone()],
        ..Config::default()
    });
    let features = RuntimeFeatures {
        cdi_devices: true,
        ..RuntimeFeatures::default()
    };
    // No spec where the runtime reads them: refused, naming the entry.
    let err = node.create("c0", &[], &config, features).unwrap_err();
    assert!(matches!(err, DeviceError::Cdi { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("gpu[0]: cdi device devgate.io/gpu="),
        "{err}"
    );
    std::fs::create_dir(&specs).unwrap();
    let inv = crate::inventory::discover(node.fixture.root());
    let generated = crate::cdi::generate(&inv, &config, &crate::cdi::Class::ALL, "0.6.0").unwrap();
    for (class, spec) in &generated.specs {
        std::fs::write(
            specs.join(class.file_name()),
            serde_json::to_vec(spec).unwrap(),
        )
        .unwrap();
    }
    let adj = node.create("c1", &[], &config, features).unwrap();
    let inv = node.fixture.expected();
    let names: Vec<&str> = adj.CDI_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            format!("devgate.io/gpu={}", inv.gpus[0].uuid),
            format!("devgate.io/rdma={}", inv.rdma[0].vfs[0].bus_id),
        ]
    );
    assert!(adj.linux.as_ref().unwrap().devices.is_empty());
    // The same config on a runtime that drops CDI names: device nodes.
    let nodes = node
        .create("c2", &[], &config, RuntimeFeatures::default())
        .unwrap();
    assert!(nodes.CDI_devices.is_empty());
    assert!(!nodes.linux.as_ref().unwrap().devices.is_empty());
}
