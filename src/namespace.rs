//! Namespaces: `[namespaces.<name>]` sections, each a policy of its own for
//! the ids `<name>:<rest>` (Centrifugo's `chat:room1`): how much history
//! they keep and for how long, whether they need a token, whether the
//! subscribe hook is asked, which webhooks are sent, whether streams get
//! `join` and `leave`. An id outside every namespace (no `:`, or a name no
//! section has) keeps the server-wide settings, as does every key a section
//! leaves out.
//!
//! Looked up once per admission, publish and history read: a hash of the
//! name (the id up to its first `:`). Nothing is kept per stream, except
//! in the Router for the streams of a namespace that sends `stream_joined`
//! or `stream_left`, or `join` and `leave` (their `sub`).

use std::collections::HashMap;

use crate::config::Settings;
use crate::events::EventSet;

/// One namespace's policy, resolved against the server-wide settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Messages kept per id (`history_size`).
    pub(crate) history_size: usize,
    /// How long, in milliseconds (`history_ttl_ms`).
    pub(crate) history_ttl_ms: u64,
    /// A stream needs a token when a subscriber key is configured
    /// (`token_required`; false: its ids are open, a token given is still
    /// checked).
    pub(crate) token_required: bool,
    /// The subscribe hook is asked when `hooks.subscribe_url` is set
    /// (`subscribe_hook`).
    pub(crate) subscribe_hook: bool,
    /// The events `hooks.events_url` gets for its ids (`webhooks`; none
    /// without `hooks.events_url`).
    pub(crate) events: EventSet,
    /// Its streams get `join` and `leave` events fleet-wide, and
    /// `/presence/{id}` lists the subjects (`presence_events`).
    pub(crate) presence_events: bool,
    /// Most streams of one id at once (`max_streams_per_id`; 0: none).
    pub(crate) max_streams_per_id: usize,
}

/// Every namespace, and the policy of ids outside them.
#[derive(Debug, Clone)]
pub(crate) struct Namespaces {
    by_name: HashMap<String, Policy>,
    default: Policy,
}

impl Namespaces {
    /// The namespaces of `settings` (validated: see `Settings::validate`).
    pub(crate) fn new(settings: &Settings) -> Namespaces {
        // Validated: a list that does not parse is refused at start-up.
        let events = |list: &str| {
            if settings.hooks.events_url.trim().is_empty() {
                EventSet::NONE
            } else {
                EventSet::parse(list).unwrap_or_default()
            }
        };
        let default = Policy {
            history_size: settings.history.size,
            history_ttl_ms: settings.history.ttl_ms,
            token_required: true,
            subscribe_hook: true,
            events: events(&settings.hooks.events),
            presence_events: false,
            max_streams_per_id: 0,
        };
        let by_name = settings
            .namespaces
            .iter()
            .map(|(name, ns)| {
                let policy = Policy {
                    history_size: ns.history_size.unwrap_or(default.history_size),
                    history_ttl_ms: ns.history_ttl_ms.unwrap_or(default.history_ttl_ms),
                    token_required: ns.token_required.unwrap_or(true),
                    subscribe_hook: ns.subscribe_hook.unwrap_or(true),
                    events: ns.webhooks.as_deref().map_or(default.events, events),
                    presence_events: ns.presence_events.unwrap_or(false),
                    max_streams_per_id: ns.max_streams_per_id.unwrap_or(0),
                };
                (name.clone(), policy)
            })
            .collect();
        Namespaces { by_name, default }
    }

    /// Every id alike: `size` messages kept for `ttl_ms`, the rest as by
    /// default.
    #[cfg(test)]
    pub(crate) fn uniform(size: usize, ttl_ms: u64) -> Namespaces {
        Namespaces {
            by_name: HashMap::new(),
            default: Policy {
                history_size: size,
                history_ttl_ms: ttl_ms,
                token_required: true,
                subscribe_hook: true,
                events: EventSet::NONE,
                presence_events: false,
                max_streams_per_id: 0,
            },
        }
    }

    /// The policy of `id`.
    pub(crate) fn of(&self, id: &str) -> &Policy {
        if self.by_name.is_empty() {
            return &self.default;
        }
        id.split_once(':')
            .and_then(|(name, _)| self.by_name.get(name))
            .unwrap_or(&self.default)
    }

    /// Whether some namespace limits its streams per id.
    pub(crate) fn limits_streams(&self) -> bool {
        self.by_name.values().any(|p| p.max_streams_per_id > 0)
    }

    /// The policy of ids outside every namespace (and of broadcasts'
    /// history).
    pub(crate) fn default_policy(&self) -> &Policy {
        &self.default
    }

    /// The shortest history TTL of any policy, in milliseconds: how often
    /// expired messages must be swept.
    pub(crate) fn shortest_ttl_ms(&self) -> u64 {
        self.by_name
            .values()
            .chain([&self.default])
            .filter(|p| p.history_size > 0)
            .map(|p| p.history_ttl_ms)
            .min()
            .unwrap_or(self.default.history_ttl_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NamespaceSettings;

    #[test]
    fn an_id_takes_its_namespaces_policy_and_the_rest_the_servers() {
        let mut s = Settings::defaults();
        s.history.size = 10;
        s.namespaces.insert(
            "chat".into(),
            NamespaceSettings {
                history_size: Some(100),
                token_required: Some(false),
                ..NamespaceSettings::default()
            },
        );
        let n = Namespaces::new(&s);
        let chat = n.of("chat:room1");
        assert_eq!((chat.history_size, chat.history_ttl_ms), (100, s.history.ttl_ms));
        assert!(!chat.token_required && chat.subscribe_hook);
        for outside in ["chat", "room1", "chatter:x", ":x", "news:chat:x"] {
            assert_eq!(n.of(outside), n.default_policy(), "{outside}");
        }
        assert_eq!(n.of("chat::x").history_size, 100);
    }
}
