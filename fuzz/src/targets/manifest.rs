//! `manifest`: an arbitrary `manifest.json` beside two real files (a checkpoint's directory as
//! a stranger may hand it over): [`read_manifest`] and [`verify_manifest`] must accept it or
//! name the file at fault, and never touch a path outside the directory (a listed name such as
//! `../x` or `/etc/passwd` is refused, not read).

use std::fs;

use xfmr_io::{read_manifest, verify_manifest, MANIFEST_FILE};

use super::scratch_dir;

/// The target's body.
pub fn run(data: &[u8]) {
    let dir = scratch_dir().join("manifest");
    fs::create_dir_all(&dir).expect("scratch directory");
    fs::write(dir.join("config.json"), b"{\"d_model\": 8}").expect("write");
    fs::write(dir.join("model.mpk"), [7u8; 64]).expect("write");
    fs::write(dir.join(MANIFEST_FILE), data).expect("write");
    if let Ok(files) = read_manifest(&dir) {
        for name in files.keys() {
            let plain = !name.is_empty()
                && !name.contains(['/', '\\'])
                && name != "."
                && name != ".."
                && !name.contains('\0');
            assert!(plain, "read_manifest accepted the name {name:?}");
        }
    }
    if let Err(e) = verify_manifest(&dir, &["config.json", "model.mpk"]) {
        assert!(
            e.path.starts_with(&dir),
            "the error names {} outside the directory",
            e.path.display()
        );
    }
}

/// The manifest `write_manifest` writes for the two files.
pub fn seeds() -> Vec<Vec<u8>> {
    let dir = scratch_dir().join("manifest-seed");
    fs::create_dir_all(&dir).expect("scratch directory");
    fs::write(dir.join("config.json"), b"{\"d_model\": 8}").expect("write");
    fs::write(dir.join("model.mpk"), [7u8; 64]).expect("write");
    xfmr_io::write_manifest(&dir, &["config.json", "model.mpk"]).expect("manifest");
    vec![fs::read(dir.join(MANIFEST_FILE)).expect("read")]
}
