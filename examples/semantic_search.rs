//! Semantic search with a pretrained sentence encoder run through xfmr's blocks: ranks a few
//! King James verses (public domain) by cosine similarity to a query.
//!
//! ```text
//! cargo run -p xfmr-cli -- fetch-model minilm          # once
//! cargo run -p xfmr-sentence --example semantic_search -- "who made the world?"
//! ```

use burn::backend::NdArray;
use xfmr_sentence::{cosine, fetch, SentenceEncoder};

const VERSES: &[&str] = &[
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.",
    "The LORD is my shepherd; I shall not want.",
    "Blessed are the peacemakers: for they shall be called the children of God.",
    "And the rain was upon the earth forty days and forty nights.",
    "Go to the ant, thou sluggard; consider her ways, and be wise.",
    "To every thing there is a season, and a time to every purpose under the heaven.",
    "And they did eat, and were all filled.",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let query = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "Who made the world?".to_string());
    let dir = fetch::find_minilm()
        .ok_or("all-MiniLM-L6-v2 not found: run `cargo run -p xfmr-cli -- fetch-model minilm`")?;
    let encoder = SentenceEncoder::<NdArray>::from_dir(&dir, &Default::default())?;
    let mut texts = vec![query.as_str()];
    texts.extend_from_slice(VERSES);
    let embeddings = encoder.embed(&texts)?;
    let mut ranked: Vec<(f32, &str)> = VERSES
        .iter()
        .zip(&embeddings[1..])
        .map(|(verse, e)| (cosine(&embeddings[0], e), *verse))
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!("query: {query}");
    for (score, verse) in ranked {
        println!("{score:6.3}  {verse}");
    }
    Ok(())
}
