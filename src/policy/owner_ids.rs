//! Owner AICs held once each for the task-owner store (`policy::tasks`).
//!
//! A store of tens of thousands of tasks names few owners (a Leader starts many tasks), and
//! an [`Aic`] is 54 bytes inline. Each entry keeps a 4-byte id into this table instead,
//! which cuts an entry to half its size; an id is counted once per entry that holds it and
//! freed (its slot reused) when the last one goes, so the table never holds more owners
//! than the store has entries.

use std::collections::HashMap;

use crate::identity::Aic;

/// Interned owners with a count of the entries naming each.
#[derive(Default)]
pub(super) struct OwnerIds {
    /// Indexed by id: the owner and how many entries hold the id (0: the slot is free).
    slots: Vec<(Aic, u32)>,
    ids: HashMap<Aic, u32, ahash::RandomState>,
    free: Vec<u32>,
}

impl OwnerIds {
    /// The id of `aic`, counted once more.
    pub(super) fn acquire(&mut self, aic: &Aic) -> u32 {
        if let Some(&id) = self.ids.get(aic) {
            self.slots[id as usize].1 += 1;
            return id;
        }
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = (*aic, 1);
                id
            }
            None => {
                // Ids stay below the store's `max_entries`, itself far below `u32::MAX`.
                let id = u32::try_from(self.slots.len()).expect("fewer owners than entries");
                self.slots.push((*aic, 1));
                id
            }
        };
        self.ids.insert(*aic, id);
        id
    }

    /// One entry holding `id` is gone; the owner goes with the last one.
    pub(super) fn release(&mut self, id: u32) {
        let slot = &mut self.slots[id as usize];
        debug_assert!(slot.1 > 0, "released more often than acquired");
        slot.1 = slot.1.saturating_sub(1);
        if slot.1 == 0 {
            self.ids.remove(&slot.0);
            self.free.push(id);
        }
    }

    /// The owner an id names.
    pub(super) fn get(&self, id: u32) -> &Aic {
        &self.slots[id as usize].0
    }

    /// Owners held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Gives back room once most owners are gone (the store's sweep calls it).
    pub(super) fn shrink(&mut self) {
        if self.slots.len() > 4 * self.ids.len().max(16) {
            // Ids are positions, so only free slots at the end can go.
            while self.slots.last().is_some_and(|s| s.1 == 0) {
                self.slots.pop();
            }
            let end = self.slots.len() as u32;
            self.free.retain(|&id| id < end);
            self.slots.shrink_to_fit();
            self.free.shrink_to_fit();
            self.ids.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aic(s: &str) -> Aic {
        Aic::parse(s).unwrap()
    }

    #[test]
    fn one_id_per_owner_freed_with_its_last_holder_and_reused() {
        let a = aic("10001000011K912345E789ABCDEF2353");
        let b = aic("10001000011K94ZH3VDXLP4S5EB63614");
        let mut t = OwnerIds::default();
        let ia = t.acquire(&a);
        assert_eq!(t.acquire(&a), ia);
        let ib = t.acquire(&b);
        assert_ne!(ia, ib);
        assert_eq!((t.get(ia), t.get(ib), t.len()), (&a, &b, 2));
        t.release(ia);
        assert_eq!(t.len(), 2, "a still has a holder");
        t.release(ia);
        assert_eq!(t.len(), 1);
        assert_eq!(t.acquire(&b), ib);
        let c = aic(crate::devcerts::DEV_LEADER_DOTTED_AIC);
        assert_eq!(t.acquire(&c), ia, "a freed slot is reused");
        assert_eq!(t.get(ia), &c);
    }

    #[test]
    fn shrinks_once_most_owners_are_gone() {
        let mut t = OwnerIds::default();
        let owners: Vec<Aic> = (0..200u32)
            .map(|i| Aic::with_check_code(&format!("10001000011K9{i:017}")).unwrap())
            .collect();
        let ids: Vec<u32> = owners.iter().map(|a| t.acquire(a)).collect();
        for &id in &ids[1..] {
            t.release(id);
        }
        t.shrink();
        assert_eq!((t.len(), t.slots.len()), (1, 1));
        assert_eq!(t.get(ids[0]), &owners[0]);
        assert_ne!(t.acquire(&owners[5]), ids[0]);
    }
}
