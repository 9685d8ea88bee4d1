mod all_reduce;
mod broadcast;
mod reduce;

pub(crate) mod tensor_map;

pub(crate) use all_reduce::*;
pub(crate) use broadcast::*;
pub(crate) use reduce::*;

pub(crate) mod client;
pub(crate) mod server;
