mod all_reduce;
mod broadcast;
mod reduce;
