//! What the process tests share: this test binary run again as a child process that
//! runs only its ignored `child` test, in a role named by an environment variable.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;

use tensorwire_cuda_ipc::schema::EndpointOptions;
use tensorwire_cuda_ipc::service::Endpoint;
use tensorwire_cuda_ipc::Outgoing;

/// `echo(x)`: sends back what it got (the same memfd ranges); neither cached nor
/// shared between callers.
pub fn echo_endpoint() -> Endpoint {
    Endpoint::new(
        "echo",
        EndpointOptions {
            cache: false,
            singleflight: false,
            ..EndpointOptions::default()
        },
        Arc::new(|args| {
            let (payload, storages) = args.storages()?;
            Outgoing::from_received(payload, &storages)
        }),
        None,
    )
}

/// Starts this test binary again as a child running its `child` test, with
/// `role_var=role` and `socket_var=path` in its environment; returns it and its
/// stdout (its stderr goes to this process's).
pub fn spawn_child(
    role_var: &str,
    role: &str,
    socket_var: &str,
    path: &Path,
) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(role_var, role)
        .env(socket_var, path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// In the child [`spawn_child`] started: its role and socket path, read from
/// `role_var` and `socket_var`; `None` when the `child` test runs in a normal test run.
pub fn child_role(role_var: &str, socket_var: &str) -> Option<(String, PathBuf)> {
    let role = std::env::var(role_var).ok()?;
    let path = PathBuf::from(std::env::var(socket_var).unwrap());
    Some((role, path))
}

/// Reads the child's stdout until a line ending in `want`.
pub fn expect_line(out: &mut BufReader<ChildStdout>, want: &str) {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "child exited before {want:?}"
        );
        if line.trim().ends_with(want) {
            return;
        }
    }
}
