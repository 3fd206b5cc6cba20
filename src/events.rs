//! The names of the events `hooks.events_url` is sent ([`crate::webhooks`]),
//! and sets of them as the settings list them (`hooks.events`,
//! `namespaces.<name>.webhooks`).

/// An event's name, as the application reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Name {
    /// An id's first stream anywhere in the fleet.
    IdOccupied = 1,
    /// An id's last stream anywhere gone, after the linger.
    IdVacated = 2,
    /// A stream of the id opened (on its node).
    StreamJoined = 4,
    /// A stream of the id ended (on its node).
    StreamLeft = 8,
}

impl Name {
    const ALL: [Name; 4] = [
        Name::IdOccupied,
        Name::IdVacated,
        Name::StreamJoined,
        Name::StreamLeft,
    ];

    /// Its name in the JSON and in the settings.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Name::IdOccupied => "id_occupied",
            Name::IdVacated => "id_vacated",
            Name::StreamJoined => "stream_joined",
            Name::StreamLeft => "stream_left",
        }
    }
}

/// A set of event names (`hooks.events`, `namespaces.<name>.webhooks`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EventSet(u8);

impl EventSet {
    /// The set none of whose events are sent.
    pub(crate) const NONE: EventSet = EventSet(0);

    /// A comma-separated list of names; an unknown one is an error naming
    /// it and the names there are.
    pub(crate) fn parse(list: &str) -> Result<EventSet, String> {
        let mut set = 0;
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let Some(found) = Name::ALL.iter().find(|n| n.as_str() == name) else {
                let known: Vec<&str> = Name::ALL.iter().map(|n| n.as_str()).collect();
                return Err(format!("{name:?} is not an event (one of {})", known.join(", ")));
            };
            set |= *found as u8;
        }
        Ok(EventSet(set))
    }

    /// Whether `name` is in it.
    pub(crate) fn has(self, name: Name) -> bool {
        self.0 & name as u8 != 0
    }

    /// Whether it has no event.
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether the id's occupancy is followed (either of its events).
    pub(crate) fn occupancy(self) -> bool {
        self.has(Name::IdOccupied) || self.has(Name::IdVacated)
    }

    /// Whether its streams are followed (either of their events).
    pub(crate) fn streams(self) -> bool {
        self.has(Name::StreamJoined) || self.has(Name::StreamLeft)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lists_parse_and_unknown_names_are_named() {
        let set = EventSet::parse("id_occupied, stream_left").unwrap();
        assert!(set.has(Name::IdOccupied) && set.has(Name::StreamLeft));
        assert!(!set.has(Name::IdVacated) && !set.has(Name::StreamJoined));
        assert!(set.occupancy() && set.streams());
        assert!(EventSet::parse("").unwrap().is_empty());
        assert!(EventSet::parse(" , ").unwrap().is_empty());
        let e = EventSet::parse("id_occupied, channel_vacated").unwrap_err();
        assert!(
            e.contains("\"channel_vacated\"") && e.contains("id_vacated"),
            "{e}"
        );
    }
}
