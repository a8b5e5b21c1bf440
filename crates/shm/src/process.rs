//! Process identities that stay unambiguous when pids are recycled.

use std::sync::atomic::{AtomicU64, Ordering};

/// A process named by its pid and its start time (clock ticks since boot, from
/// `/proc/<pid>/stat`). Two processes that reuse one pid have different start times,
/// so a lease recorded with a `ProcessId` is never credited to a stranger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessId {
    /// The process id.
    pub pid: u32,
    /// Start time in clock ticks since boot; 0 where `/proc` is not available.
    pub start_time: u64,
}

/// `(pid << 32 | 1)` of the process that filled [`CURRENT_START`]; rechecked after a
/// fork, whose child has a new pid.
static CURRENT_PID: AtomicU64 = AtomicU64::new(0);
static CURRENT_START: AtomicU64 = AtomicU64::new(0);

impl ProcessId {
    /// This process.
    pub fn current() -> ProcessId {
        let pid = std::process::id();
        let tag = (u64::from(pid) << 32) | 1;
        if CURRENT_PID.load(Ordering::Acquire) == tag {
            return ProcessId {
                pid,
                start_time: CURRENT_START.load(Ordering::Acquire),
            };
        }
        let start_time = read_stat(pid).map(|s| s.start_time).unwrap_or(0);
        CURRENT_START.store(start_time, Ordering::Release);
        CURRENT_PID.store(tag, Ordering::Release);
        ProcessId { pid, start_time }
    }

    /// True while the process runs: it exists, is not a zombie (killed but not yet
    /// reaped by its parent counts as gone), and started when this id says.
    pub fn is_alive(&self) -> bool {
        if self.pid == 0 {
            return false;
        }
        match read_stat(self.pid) {
            Some(stat) => {
                !matches!(stat.state, b'Z' | b'X' | b'x')
                    && (self.start_time == 0 || stat.start_time == self.start_time)
            }
            // No /proc entry: gone (or /proc is not mounted, where we fall back to
            // asking the kernel whether the pid exists).
            None => !proc_mounted() && pid_exists(self.pid),
        }
    }

    /// The id packed into one `u64` pair for storing in shared memory.
    pub fn to_words(self) -> [u64; 2] {
        [u64::from(self.pid), self.start_time]
    }

    /// The id from [`ProcessId::to_words`]; `None` for the all-zero "nobody".
    pub fn from_words(words: [u64; 2]) -> Option<ProcessId> {
        let pid = u32::try_from(words[0]).ok().filter(|&p| p != 0)?;
        Some(ProcessId {
            pid,
            start_time: words[1],
        })
    }
}

struct Stat {
    state: u8,
    start_time: u64,
}

/// Fields 3 (state) and 22 (starttime) of `/proc/<pid>/stat`. The command name (field
/// 2) is in parentheses and may itself contain spaces and parentheses, so fields are
/// counted from the last `)`.
fn read_stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    // After the state come fields 4..=21 (18 of them), then starttime.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(Stat { state, start_time })
}

fn proc_mounted() -> bool {
    std::path::Path::new("/proc/self/stat").exists()
}

fn pid_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks that the pid exists and
    // may be signalled.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_round_trips() {
        let me = ProcessId::current();
        assert_eq!(me.pid, std::process::id());
        assert!(me.start_time > 0);
        assert!(me.is_alive());
        assert_eq!(ProcessId::from_words(me.to_words()), Some(me));
        assert_eq!(ProcessId::from_words([0, 0]), None);
    }

    #[test]
    fn a_recycled_pid_or_an_exited_child_is_not_alive() {
        let me = ProcessId::current();
        let stranger = ProcessId {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!stranger.is_alive());

        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = ProcessId {
            pid: child.id(),
            start_time: read_stat(child.id()).map(|s| s.start_time).unwrap_or(0),
        };
        child.wait().unwrap();
        assert!(!id.is_alive());
    }

    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Wait until it has exited but do not reap it yet.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while read_stat(pid).map(|s| s.state) != Some(b'Z') {
            assert!(std::time::Instant::now() < deadline, "child never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!ProcessId { pid, start_time: 0 }.is_alive());
        child.wait().unwrap();
    }
}
