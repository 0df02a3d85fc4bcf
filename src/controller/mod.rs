//! The central controller. Only the drain engine lives here so far.

pub mod drain;
