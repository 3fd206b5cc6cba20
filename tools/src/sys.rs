//! What the load tools need from the operating system beyond std and tokio:
//! the open-file limit, this process's resident memory, and one socket
//! option. The only `unsafe` in the crate lives here.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;

/// Raises the soft open-file limit to the hard limit; returns the new soft
/// limit. (The hard limit here is 20,000 and cannot be raised.)
pub(crate) fn raise_nofile() -> io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
}

/// Resident set size of this process, from `VmRSS` in `/proc/self/status`.
pub(crate) fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Sets `IP_BIND_ADDRESS_NO_PORT`: binding a source address then picks the
/// port at connect time, per destination, so one source IP is not capped at
/// ~28k connections by the ephemeral port range.
///
/// Hand-written because neither socket2 0.5 nor tokio exposes this option;
/// `unsafe` because `setsockopt` takes a raw pointer and length.
pub(crate) fn bind_address_no_port(socket: &impl AsRawFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: a valid fd, a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rss_is_readable() {
        assert!(super::rss_bytes().unwrap() > 0);
    }
}
