//! Process limits and socket options the load tools need that std, tokio and
//! socket2 do not expose. The only `unsafe` in the crate lives here.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;

/// Raises the soft open-file limit to the hard limit; returns the new soft
/// limit. (The hard limit here is 20,000 and cannot be raised.)
pub fn raise_nofile() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    Ok(lim.rlim_cur)
}

/// Sets `IP_BIND_ADDRESS_NO_PORT`: binding a source address then picks the
/// port at connect time, per destination, so one source IP is not capped at
/// ~28k connections by the ephemeral port range.
pub fn bind_address_no_port(socket: &impl AsRawFd) -> io::Result<()> {
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
