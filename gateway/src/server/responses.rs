//! A connection's responses, kept in request order until they are written.
//!
//! The reader takes a [`Place`] for each request as it admits it; the
//! request's task fills its place when it is done; the writer writes the
//! places at the front as they fill. Only filling the front place wakes the
//! writer: admitting a request wakes nobody.
//!
//! The writer used to receive each request's task handle through a channel
//! and wait on it. Every admitted request then woke the writer twice (for
//! the handle, then for the answer), and the first wake, made while the
//! request's new task waited in the worker's next-task slot, pushed that
//! task to the run queue and woke the other worker thread to steal it: at a
//! low request rate each request crossed threads, and every crossing is a
//! futex wake and a context switch (an idle virtual CPU woken, on a VM).
//! Now no wake of the gateway's own hands a request to the other thread:
//! its task, its Redis connection's task and the writer run on whichever
//! thread the sockets wake.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::Response;

/// The responses of one connection, in request order.
pub(super) struct Responses {
    queue: Mutex<Queue>,
    /// Wakes the writer: the front place was filled, or the reader is done.
    wake: Notify,
    /// Places not yet written, at most `broker.max_inflight_requests`: the
    /// reader waits for room before it admits another request.
    room: Arc<Semaphore>,
}

#[derive(Default)]
struct Queue {
    places: VecDeque<Entry>,
    /// The number of the place at the front (places are numbered from 0 in
    /// request order).
    front: u64,
    /// The reader admits no more requests.
    closed: bool,
    /// The writer has stopped: nothing more is kept.
    gone: bool,
}

struct Entry {
    state: State,
    _room: OwnedSemaphorePermit,
}

enum State {
    Waiting,
    /// `None`: nothing to write (an acks=0 produce).
    Filled(Option<Response>),
    /// The request's task ended without an answer (it panicked).
    Abandoned,
}

/// What the writer finds at the front.
pub(super) enum Front {
    /// The next response, and whether the one after it is ready too (then
    /// the two share a write).
    Ready(Option<Response>, bool),
    /// The front request is still being worked on.
    Waiting,
    /// The reader is done and everything has been written.
    End,
    /// The front request's task ended without an answer.
    Abandoned,
}

/// A request's place in the response order; filled once, by its task.
/// Dropped unfilled (the task panicked), it tells the writer to close the
/// connection rather than wait for it for ever.
pub(super) struct Place {
    responses: Arc<Responses>,
    number: u64,
    filled: bool,
}

impl Responses {
    pub(super) fn new(max_inflight: usize) -> Arc<Responses> {
        Arc::new(Responses {
            queue: Mutex::default(),
            wake: Notify::new(),
            room: Arc::new(Semaphore::new(max_inflight.max(1))),
        })
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        // A panic while the lock is held leaves the queue consistent (no
        // step of it can panic half-way): go on with it.
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next place in the response order, once there is room for it;
    /// `None` when the writer has stopped.
    pub(super) async fn place(self: &Arc<Self>) -> Option<Place> {
        let room = self.room.clone().acquire_owned().await.ok()?;
        let mut queue = self.queue();
        if queue.gone {
            return None;
        }
        let number = queue.front + queue.places.len() as u64;
        queue.places.push_back(Entry {
            state: State::Waiting,
            _room: room,
        });
        Some(Place {
            responses: self.clone(),
            number,
            filled: false,
        })
    }

    /// Queues a response that is ready now (SASL and error answers);
    /// `false` when the writer has stopped.
    pub(super) async fn answer(self: &Arc<Self>, bytes: Bytes) -> bool {
        let Some(place) = self.place().await else {
            return false;
        };
        place.fill(Some(Response {
            chunks: vec![bytes],
            _budget: None,
        }));
        true
    }

    /// The reader admits no more: the writer ends once it has written what
    /// was admitted.
    pub(super) fn close(&self) {
        self.queue().closed = true;
        self.wake.notify_one();
    }

    /// Takes the front response when it is ready.
    pub(super) fn front(&self) -> Front {
        let mut queue = self.queue();
        let Some(entry) = queue.places.front_mut() else {
            return if queue.closed { Front::End } else { Front::Waiting };
        };
        match entry.state {
            State::Waiting => Front::Waiting,
            State::Abandoned => Front::Abandoned,
            State::Filled(_) => {
                // Its room is given back as the writer takes it.
                let Some(Entry {
                    state: State::Filled(response),
                    ..
                }) = queue.places.pop_front()
                else {
                    unreachable!("the front entry was filled");
                };
                queue.front += 1;
                let next_ready = queue
                    .places
                    .front()
                    .is_some_and(|next| !matches!(next.state, State::Waiting));
                Front::Ready(response, next_ready)
            }
        }
    }

    /// Waits until the front place may have been filled (or the reader
    /// closed). A wake given while the writer was not waiting is kept, so
    /// none is missed between [`Responses::front`] and this.
    pub(super) async fn changed(&self) {
        self.wake.notified().await;
    }

    /// The writer has stopped: drop what is kept and refuse new places
    /// (the reader then stops too).
    pub(super) fn stop(&self) {
        let mut queue = self.queue();
        queue.gone = true;
        queue.places.clear();
        drop(queue);
        self.room.close();
    }

    fn settle(&self, number: u64, state: State) {
        let mut queue = self.queue();
        if queue.gone {
            return;
        }
        let Some(index) = number.checked_sub(queue.front) else {
            return;
        };
        if let Some(entry) = queue.places.get_mut(index as usize) {
            entry.state = state;
        }
        // Only the front place's filling lets the writer go on.
        if index == 0 {
            drop(queue);
            self.wake.notify_one();
        }
    }
}

impl Place {
    /// Fills the place with the request's response (`None`: no response).
    pub(super) fn fill(mut self, response: Option<Response>) {
        self.filled = true;
        self.responses.settle(self.number, State::Filled(response));
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if !self.filled {
            self.responses.settle(self.number, State::Abandoned);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(text: &'static str) -> Option<Response> {
        Some(Response {
            chunks: vec![Bytes::from_static(text.as_bytes())],
            _budget: None,
        })
    }

    fn text(front: Front) -> Option<(String, bool)> {
        match front {
            Front::Ready(Some(r), next) => Some((String::from_utf8(r.chunks.concat()).expect("text"), next)),
            _ => None,
        }
    }

    #[tokio::test]
    async fn responses_leave_in_request_order_whatever_order_they_are_filled_in() {
        let responses = Responses::new(8);
        let first = responses.place().await.expect("room");
        let second = responses.place().await.expect("room");
        let third = responses.place().await.expect("room");
        third.fill(response("c"));
        second.fill(None);
        assert!(
            matches!(responses.front(), Front::Waiting),
            "the first is not answered yet"
        );
        first.fill(response("a"));
        assert_eq!(text(responses.front()), Some(("a".to_owned(), true)));
        assert!(
            matches!(responses.front(), Front::Ready(None, true)),
            "an acks=0 produce writes nothing"
        );
        assert_eq!(text(responses.front()), Some(("c".to_owned(), false)));
        assert!(matches!(responses.front(), Front::Waiting));
        responses.close();
        assert!(matches!(responses.front(), Front::End));
    }

    #[tokio::test]
    async fn only_filling_the_front_place_wakes_the_writer() {
        let responses = Responses::new(8);
        let first = responses.place().await.expect("room");
        let second = responses.place().await.expect("room");
        let changed = responses.changed();
        tokio::pin!(changed);
        assert!(futures::poll!(&mut changed).is_pending());
        second.fill(response("b"));
        assert!(futures::poll!(&mut changed).is_pending(), "a later place filled");
        first.fill(response("a"));
        assert!(futures::poll!(&mut changed).is_ready(), "the front place filled");
    }

    #[tokio::test]
    async fn a_wake_before_the_writer_waits_is_kept() {
        let responses = Responses::new(8);
        let place = responses.place().await.expect("room");
        assert!(matches!(responses.front(), Front::Waiting));
        place.fill(response("a"));
        // The writer looked, then the place filled, then it waits.
        tokio::time::timeout(std::time::Duration::from_secs(5), responses.changed())
            .await
            .expect("the wake was kept");
    }

    #[tokio::test]
    async fn a_place_dropped_unfilled_is_abandoned() {
        let responses = Responses::new(8);
        let place = responses.place().await.expect("room");
        drop(place);
        assert!(matches!(responses.front(), Front::Abandoned));
    }

    #[tokio::test]
    async fn the_reader_waits_for_room_and_stops_when_the_writer_does() {
        let responses = Responses::new(2);
        let first = responses.place().await.expect("room");
        let _second = responses.place().await.expect("room");
        let third = responses.place();
        tokio::pin!(third);
        assert!(futures::poll!(&mut third).is_pending(), "two places are the most");
        first.fill(response("a"));
        assert!(
            futures::poll!(&mut third).is_pending(),
            "room comes back when a response is taken"
        );
        assert!(text(responses.front()).is_some());
        assert!(matches!(
            futures::poll!(&mut third),
            std::task::Poll::Ready(Some(_))
        ));
        responses.stop();
        assert!(
            responses.place().await.is_none(),
            "no places once the writer has stopped"
        );
        assert!(!responses.answer(Bytes::from_static(b"x")).await);
    }
}
