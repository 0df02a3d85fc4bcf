//! The controller as one member of the cluster: Lease election ([`leader`], [`leader_pod`]), its
//! supervised tasks ([`supervise`]), the Event recorder ([`events`]) and
//! the scheduling-delay probe ([`delay`]).

pub mod delay;
pub mod events;
pub mod leader;
pub mod leader_pod;
pub mod supervise;
