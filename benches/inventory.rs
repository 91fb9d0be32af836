//! Discovery of the HGX fixture: 8 GPUs, 10 RDMA PFs, 34 VFs, 42 RDMA devices.

use criterion::{criterion_group, criterion_main, Criterion};
use devgate::fixture::HostRootBuilder;
use devgate::inventory::{discover, view::InventoryView};

fn inventory(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = HostRootBuilder::hgx().build(dir.path()).expect("fixture");
    let root = fixture.root().to_path_buf();
    assert!(discover(&root).warnings.is_empty());
    c.bench_function("inventory/discover_hgx", |b| b.iter(|| discover(&root)));
    c.bench_function("inventory/discover_hgx_json", |b| {
        b.iter(|| serde_json::to_string(&InventoryView::new(&discover(&root))))
    });
}

criterion_group!(benches, inventory);
criterion_main!(benches);
