//! A process that uses the GPU as a tenant would, through the CUDA driver API
//! (libcuda.so.1, loaded at run time, declared here by hand from cuda.h): it
//! holds a context, or makes the GPU fault. It runs as a child: the test binary
//! started again with `DEVGATE_GPU_NODE_ROLE` set, so that the testing process
//! itself never holds a CUDA context (a teardown would find it in the way).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The role a child plays, from the environment.
pub const ROLE_ENV: &str = "DEVGATE_GPU_NODE_ROLE";
/// The PCI address of the GPU the child uses: CUDA's ordinals follow its own
/// order and `CUDA_VISIBLE_DEVICES`, not NVML's index.
pub const BUS_ENV: &str = "DEVGATE_GPU_NODE_BUS";
/// The test the child runs (see `gpu_node.rs`).
pub const CHILD_TEST: &str = "cuda_child";

type CuResult = c_int;
const CUDA_SUCCESS: CuResult = 0;

/// A kernel storing to address 0: a GPU page fault (XID 31, "MMU fault", on
/// the H200), which ends the context and leaves the GPU usable. PTX for sm_70
/// is compiled by the driver for any later GPU (PTX ISA 7.0: CUDA 11 drivers on).
const FAULT_PTX: &CStr = c".version 7.0
.target sm_70
.address_size 64
.visible .entry devgate_fault()
{
    .reg .u64 %rd<2>;
    .reg .u32 %r<2>;
    mov.u64 %rd1, 0;
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
";

struct Cuda(*mut c_void);

impl Cuda {
    fn open() -> Cuda {
        // SAFETY: a C string; RTLD_NOW resolves everything at once.
        let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
        assert!(!lib.is_null(), "dlopen libcuda.so.1 failed");
        Cuda(lib)
    }

    /// A function of libcuda.
    ///
    /// # Safety
    /// `F` must be the `unsafe extern "C" fn` type cuda.h declares for `name`.
    unsafe fn sym<F: Copy>(&self, name: &CStr) -> F {
        // Where a child stops is where it hangs: stderr reaches the log.
        eprintln!("cuda child {}: {name:?}", std::process::id());
        // SAFETY: a live handle and a C string.
        let ptr = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        assert!(!ptr.is_null(), "libcuda has no {name:?}");
        assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
        // SAFETY: same size, and the caller names the declared signature.
        unsafe { std::mem::transmute_copy::<*mut c_void, F>(&ptr) }
    }

    fn check(name: &str, code: CuResult) {
        assert_eq!(code, CUDA_SUCCESS, "{name} failed with CUresult {code}");
    }

    /// cuInit, then the primary context of the GPU at PCI address `bus` made
    /// current (and created).
    fn context(&self, bus: &CStr) {
        type Init = unsafe extern "C" fn(c_uint) -> CuResult;
        type DeviceByBus = unsafe extern "C" fn(*mut c_int, *const c_char) -> CuResult;
        type Retain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult;
        type SetCurrent = unsafe extern "C" fn(*mut c_void) -> CuResult;
        type MemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CuResult;
        let (mut dev, mut ctx, mut mem) = (0, std::ptr::null_mut(), 0u64);
        // SAFETY: the types cuda.h declares; out pointers to locals.
        unsafe {
            Self::check("cuInit", self.sym::<Init>(c"cuInit")(0));
            Self::check(
                "cuDeviceGetByPCIBusId",
                self.sym::<DeviceByBus>(c"cuDeviceGetByPCIBusId")(&mut dev, bus.as_ptr()),
            );
            Self::check(
                "cuDevicePrimaryCtxRetain",
                self.sym::<Retain>(c"cuDevicePrimaryCtxRetain")(&mut ctx, dev),
            );
            Self::check(
                "cuCtxSetCurrent",
                self.sym::<SetCurrent>(c"cuCtxSetCurrent")(ctx),
            );
            Self::check(
                "cuMemAlloc_v2",
                self.sym::<MemAlloc>(c"cuMemAlloc_v2")(&mut mem, 1 << 20),
            );
        }
    }

    /// Launches [`FAULT_PTX`] and returns what synchronising reports.
    fn fault(&self) -> CuResult {
        type Load = unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> CuResult;
        type GetFunction =
            unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> CuResult;
        type Launch = unsafe extern "C" fn(
            *mut c_void,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> CuResult;
        type Sync = unsafe extern "C" fn() -> CuResult;
        let (mut module, mut function) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: the types cuda.h declares; a NUL-terminated PTX image, out
        // pointers to locals, a kernel without parameters on the default stream.
        unsafe {
            Self::check(
                "cuModuleLoadData",
                self.sym::<Load>(c"cuModuleLoadData")(&mut module, FAULT_PTX.as_ptr().cast()),
            );
            Self::check(
                "cuModuleGetFunction",
                self.sym::<GetFunction>(c"cuModuleGetFunction")(
                    &mut function,
                    module,
                    c"devgate_fault".as_ptr(),
                ),
            );
            let launch = self.sym::<Launch>(c"cuLaunchKernel");
            let null = std::ptr::null_mut();
            Self::check(
                "cuLaunchKernel",
                launch(
                    function,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    null,
                    null.cast(),
                    null.cast(),
                ),
            );
            self.sym::<Sync>(c"cuCtxSynchronize")()
        }
    }
}

/// The child's part: hold a context until killed ("hold"), or fault once and
/// exit ("fault"). Prints one line the parent waits for.
pub fn child(role: &str) {
    let bus = std::env::var(BUS_ENV).expect("the gpu's pci address");
    let cuda = Cuda::open();
    cuda.context(&std::ffi::CString::new(bus).unwrap());
    match role {
        "hold" => {
            println!("{MARK}holding");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        "fault" => println!("{MARK}fault {}", cuda.fault()),
        other => panic!("unknown role {other}"),
    }
}

/// A child process, killed and reaped when dropped, so that a failing test
/// leaves no process holding the GPU (or its pod cgroup busy).
pub struct Tenant(pub Child);

impl Tenant {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Its exit status, waiting up to `limit`; `None` while it still runs.
    pub fn exited(&mut self, limit: std::time::Duration) -> Option<std::process::ExitStatus> {
        let start = std::time::Instant::now();
        loop {
            match self.0.try_wait().unwrap() {
                Some(status) => return Some(status),
                None if start.elapsed() >= limit => return None,
                None => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child of this test binary (a copy in `dir`) in `role` on the GPU at PCI
/// address `bus`, placed in `cgroup` (its `cgroup.procs`) before it touches
/// the GPU. Returns once it printed its line, with that line.
pub fn spawn(
    role: &str,
    bus: &str,
    cgroup: Option<&std::path::Path>,
    dir: &std::path::Path,
) -> (Tenant, String) {
    let mut cmd = Command::new(tenant_program(dir));
    cmd.args(["--ignored", "--exact", CHILD_TEST, "--nocapture"])
        .args(["--test-threads", "1"])
        .env(ROLE_ENV, role)
        .env(BUS_ENV, bus)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .stdout(Stdio::piped());
    if let Some(cgroup) = cgroup {
        let procs = std::ffi::CString::new(
            cgroup
                .join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: join makes raw calls only, on a string made before the fork.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || crate::cgroup_join::join(std::slice::from_ref(&procs)));
        }
    }
    let mut child = Tenant(cmd.spawn().expect("start the cuda child"));
    let out = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Bytes, not text: a line that is not UTF-8 must not end the reading.
        let mut lines = BufReader::new(out).split(b'\n').map_while(Result::ok);
        // libtest writes "test <name> ... " before the test runs, on the same line.
        let found = lines.find_map(|l| {
            let line = String::from_utf8_lossy(&l).into_owned();
            line.split_once(MARK).map(|(_, rest)| rest.to_string())
        });
        let _ = tx.send(found);
        // Read to the end: a closed pipe would fail the child's last words.
        lines.for_each(drop);
    });
    match rx.recv_timeout(LINE_TIMEOUT) {
        Ok(Some(line)) => (child, line),
        Ok(None) => {
            let status = child.exited(LINE_TIMEOUT);
            panic!("the cuda child ({role}) ended without its line: {status:?}");
        }
        Err(_) => {
            let stacks = kernel_stacks(child.pid());
            panic!("the cuda child ({role}) printed nothing in {LINE_TIMEOUT:?}; its threads:\n{stacks}");
        }
    }
}

/// A copy of this test binary in `dir`: teardown takes a process running
/// devgate's own program (inode) for another devgate's NVML, no user, and a
/// tenant's program is never that.
fn tenant_program(dir: &std::path::Path) -> std::path::PathBuf {
    let copy = dir.join("gpu-node-tenant");
    if !copy.exists() {
        std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
    }
    copy
}

/// What starts the child's line.
const MARK: &str = "devgate-gpu-node: ";

/// How long a child may take to hold a context or fault.
const LINE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Each thread's kernel stack and wait channel (root only), to show where a
/// child hangs.
fn kernel_stacks(pid: u32) -> String {
    let mut out = String::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    for task in tasks.flatten() {
        let read = |f: &str| std::fs::read_to_string(task.path().join(f)).unwrap_or_default();
        out += &format!(
            "task {} {} wchan {}\n{}",
            task.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan"),
            read("stack")
        );
    }
    out
}
