//! Turning a panic inside a message handler into a supervised restart.
//!
//! actix's `Supervisor` restarts an actor that *stops*, calling
//! `Supervised::restarting` on the same struct and keeping the same mailbox
//! and address. A panic inside a handler, though, unwinds out of the actor's
//! task: tokio drops the task, the actor and its state are gone, nothing is
//! restarted, and every `Addr` left behind is dead. So the Router and Counter
//! run each handler body through [`guarded`]: a panic is caught at the
//! handler boundary, logged, and turned into `ctx.stop()`, which the
//! Supervisor answers with a restart. The actor's fields survive (the Router
//! keeps its registrations, the Counter its count); only the message whose
//! handler panicked is lost, and its sender gets `None`.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use actix::{Actor, ActorContext, Context, Message};

/// Fault injection (`POST /admin/crash/{actor}`): the Router, the Counter
/// and the Bus each panic inside their handler of it, so the restart path
/// can be tested on a live server. Answers `None` (the handler panicked).
#[derive(Message)]
#[rtype(result = "Option<()>")]
pub(crate) struct Crash;

/// Runs `body`; on panic logs it, stops the actor (so its Supervisor restarts
/// it) and returns `None`.
pub(crate) fn guarded<A, R>(
    act: &mut A,
    ctx: &mut Context<A>,
    body: impl FnOnce(&mut A, &mut Context<A>) -> R,
) -> Option<R>
where
    A: Actor<Context = Context<A>>,
{
    match catch_unwind(AssertUnwindSafe(|| body(act, ctx))) {
        Ok(r) => Some(r),
        Err(payload) => {
            tracing::error!(
                event = "actor_panic",
                actor = %actor_name::<A>(),
                cause = panic_message(&*payload),
                "actor panicked in a handler; restarting it"
            );
            ctx.stop();
            None
        }
    }
}

/// `A`'s name as the `restart` lines give it: `router`, `counter`, `bus`.
fn actor_name<A>() -> String {
    let full = std::any::type_name::<A>();
    let bare = full.split('<').next().unwrap_or(full);
    bare.rsplit("::").next().unwrap_or(bare).to_ascii_lowercase()
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}

#[cfg(test)]
mod tests {
    #[test]
    fn actors_are_named_as_in_restart_lines() {
        assert_eq!(super::actor_name::<crate::counter::Counter>(), "counter");
        assert_eq!(
            super::actor_name::<crate::hub::router::Router<crate::stream::Stream>>(),
            "router"
        );
    }
}
