//! The shared BPE vocabulary: special ids, lossless round trips, saving and loading, errors.

use xfmr_translate::tokenizer::{SubwordTokenizer, TokenizerError, BOS, EOS, PAD, UNK};

fn corpus() -> Vec<String> {
    let base = [
        "En el principio creó Dios los cielos y la tierra.",
        "In the beginning God created the heaven and the earth.",
        "Y dijo Dios: Sea la luz: y fué la luz.",
        "And God said, Let there be light: and there was light.",
        "¿Quién es éste? «¡Hola!», dijo el niño; y se fué.",
        "Who is this? 'Hello!' said the child; and he went away.",
    ];
    (0..20)
        .flat_map(|_| base.iter().map(|s| s.to_string()))
        .collect()
}

#[test]
fn bpe_round_trips_and_keeps_special_ids() {
    let sentences = corpus();
    let tok = SubwordTokenizer::train(sentences.iter(), 200).unwrap();
    assert!(
        tok.vocab_size() <= 200 && tok.vocab_size() > 50,
        "{}",
        tok.vocab_size()
    );
    // The special ids are those of the named special pieces, the first four of the vocabulary.
    let named = |name: &str| (0..4).find(|&id| tok.piece(id).as_deref() == Some(name));
    assert_eq!(named(PAD), Some(tok.pad_id()));
    assert_eq!(named(BOS), Some(tok.bos_id()));
    assert_eq!(named(EOS), Some(tok.eos_id()));
    let unk_id = named(UNK).expect("<unk> among the first four pieces");
    let specials = [tok.pad_id(), tok.bos_id(), tok.eos_id(), unk_id];
    for s in &sentences[..6] {
        let ids = tok.encode(s).unwrap();
        assert!(
            ids.iter().all(|i| !specials.contains(i)),
            "{s}: special id inside {ids:?}"
        );
        assert_eq!(&tok.decode(&ids).unwrap(), s);
        // Learnt merges: far fewer subwords than characters.
        assert!(
            ids.len() * 2 < s.chars().count(),
            "{s}: {} pieces",
            ids.len()
        );
    }
    // Specials in the id stream are dropped on decoding.
    let mut ids = vec![tok.bos_id()];
    ids.extend(tok.encode("the earth").unwrap());
    ids.extend([tok.eos_id(), tok.pad_id()]);
    assert_eq!(tok.decode(&ids).unwrap(), "the earth");
    // An unseen character becomes <unk> rather than failing.
    let unk = tok.encode("the 地 earth").unwrap();
    assert!(unk.contains(&unk_id), "{unk:?}");

    assert!(matches!(
        tok.decode(&[5, 10_000]),
        Err(TokenizerError::IdOutOfRange { id: 10_000, .. })
    ));
}

#[test]
fn vocabulary_saves_loads_and_names_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    let tok = SubwordTokenizer::train(corpus().iter(), 150).unwrap();
    tok.save(&path).unwrap();
    let back = SubwordTokenizer::load(&path).unwrap();
    let s = "Y dijo Dios: Sea la luz.";
    assert_eq!(back.encode(s).unwrap(), tok.encode(s).unwrap());
    assert_eq!(back.vocab_size(), tok.vocab_size());

    let bad = dir.path().join("broken.json");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&bad, &bytes[..bytes.len() / 2]).unwrap();
    for p in [bad, dir.path().join("missing.json")] {
        match SubwordTokenizer::load(&p) {
            Err(TokenizerError::File { path, .. }) => assert_eq!(path, p),
            other => panic!("{}: expected a File error, got {other:?}", p.display()),
        }
    }
}
