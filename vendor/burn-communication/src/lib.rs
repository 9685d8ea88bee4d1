#[macro_use]
extern crate derive_new;

mod base;
pub use base::*;

pub mod util;

#[cfg(feature = "websocket")]
pub mod websocket;

#[cfg(feature = "data-service")]
pub mod data_service;
