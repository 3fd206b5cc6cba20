//! The `Date` header value for responses the lean paths write themselves.

use std::cell::RefCell;
use std::time::SystemTime;

/// Now as an HTTP date, formatted at most once a second per worker thread.
pub(crate) fn now() -> String {
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != secs {
            *at = secs;
            *text = httpdate::fmt_http_date(now);
        }
        text.clone()
    })
}
