//! The node-wide pull slots, handed out fairly between tenants.
//!
//! A node pulls at most `--max-concurrent-pulls` images at once. A first-come queue let one
//! tenant's many jobs (or its slow `Never` jobs, each retrying) hold every slot while another
//! tenant's tag, a pre-download a rollout waits on, say, sat `Waiting` behind all of them. Here
//! the waiters queue per *share* (the namespace of the tag's first owner job: a tenant), and a
//! slot that comes free goes to the next share in turn, each share's own waiters first come,
//! first served. A free slot is taken at once when nobody waits.
//!
//! Nothing is pre-empted: a pull in progress keeps its slot until its attempt ends (pull.rs
//! gives it back for every pause between attempts).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// The slots of one node.
#[derive(Debug)]
pub(crate) struct FairSlots {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    free: usize,
    closed: bool,
    next_id: u64,
    /// Each share's waiters, oldest first; a share is here only while it has waiters.
    queues: BTreeMap<Arc<str>, VecDeque<Waiter>>,
    /// The shares with waiters, in the order they are served.
    turns: VecDeque<Arc<str>>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    /// `true`: a slot is handed over; `false`: the slots were closed.
    wake: oneshot::Sender<bool>,
}

impl FairSlots {
    /// `count` slots (at least one).
    pub(crate) fn new(count: usize) -> Self {
        Self {
            state: Mutex::new(State {
                free: count.max(1),
                closed: false,
                next_id: 0,
                queues: BTreeMap::new(),
                turns: VecDeque::new(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain counters behind: keep using them.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot for `share`; `false` once the slots are closed. Cancel-safe: a wait
    /// dropped after a slot was handed to it gives the slot on.
    pub(crate) async fn acquire(&self, share: &str) -> bool {
        let (id, rx) = {
            let mut state = self.state();
            if state.closed {
                return false;
            }
            if state.free > 0 && state.turns.is_empty() {
                state.free -= 1;
                return true;
            }
            let (tx, rx) = oneshot::channel();
            let id = state.next_id;
            state.next_id += 1;
            let share: Arc<str> = Arc::from(share);
            let State { queues, turns, .. } = &mut *state;
            let queue = queues.entry(share.clone()).or_default();
            if queue.is_empty() {
                turns.push_back(share);
            }
            queue.push_back(Waiter { id, wake: tx });
            (id, rx)
        };
        let mut wait = Wait {
            slots: self,
            id,
            rx: Some(rx),
        };
        let granted = match wait.rx.as_mut() {
            Some(rx) => rx.await.unwrap_or(false),
            None => false,
        };
        // Answered: nothing left for the guard to undo.
        wait.rx = None;
        granted
    }

    /// Gives a slot back: to the next share in turn, else to the free count.
    pub(crate) fn release(&self) {
        let mut state = self.state();
        while let Some(share) = state.turns.pop_front() {
            let Some(queue) = state.queues.get_mut(&share) else {
                continue;
            };
            let waiter = queue.pop_front();
            if queue.is_empty() {
                state.queues.remove(&share);
            } else {
                state.turns.push_back(share);
            }
            // A waiter that went away (its wait dropped) cannot take it: the next one can.
            if let Some(waiter) = waiter
                && waiter.wake.send(true).is_ok()
            {
                return;
            }
        }
        state.free += 1;
    }

    /// Refuses every waiter and every later acquire. Only tests close the slots: the daemon
    /// aborts its workers at shutdown instead.
    #[cfg(test)]
    pub(crate) fn close(&self) {
        let mut state = self.state();
        state.closed = true;
        state.turns.clear();
        for (_, queue) in std::mem::take(&mut state.queues) {
            for waiter in queue {
                let _ = waiter.wake.send(false);
            }
        }
    }

    /// Slots free now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.state().free
    }
}

/// A wait in progress: dropped before its answer was read, it leaves the queue, or gives on a
/// slot that was handed to it meanwhile.
struct Wait<'a> {
    slots: &'a FairSlots,
    id: u64,
    rx: Option<oneshot::Receiver<bool>>,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        rx.close();
        match rx.try_recv() {
            Ok(true) => self.slots.release(),
            Ok(false) => {}
            Err(_) => {
                let mut state = self.slots.state();
                let State { queues, turns, .. } = &mut *state;
                let mut emptied = None;
                for (share, queue) in queues.iter_mut() {
                    if let Some(at) = queue.iter().position(|w| w.id == self.id) {
                        queue.remove(at);
                        if queue.is_empty() {
                            emptied = Some(share.clone());
                        }
                        break;
                    }
                }
                if let Some(share) = emptied {
                    queues.remove(&share);
                    turns.retain(|s| *s != share);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
