//! A disk that fills up, for a test of a full disk under a running server.
//! (The test's database is `idem_testkit::db`.)

use std::process::Command;

/// A small file system of its own (a tmpfs, mounted as root, as CI runs) that
/// a test can fill to the last byte and free again: a full disk under a
/// running server. Unmounted when dropped.
pub struct SmallDisk {
    pub dir: std::path::PathBuf,
}

impl SmallDisk {
    pub fn mount(bytes: u64) -> Self {
        let dir = std::env::temp_dir().join(format!("idem_disk_{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a {bytes}-byte tmpfs at {} failed: this test needs root (as CI runs)",
            dir.display()
        );
        Self { dir }
    }

    /// Writes a file until the disk refuses another byte.
    pub fn fill(&self) {
        use std::io::Write;
        let mut filler = std::fs::File::create(self.filler()).expect("filler file");
        let chunk = vec![0u8; 4096];
        while filler.write_all(&chunk).is_ok() {}
        while filler.write_all(&[0]).is_ok() {}
        let _ = filler.sync_all();
    }

    /// Gives back what [`SmallDisk::fill`] took.
    pub fn free(&self) {
        std::fs::remove_file(self.filler()).expect("remove the filler");
    }

    fn filler(&self) -> std::path::PathBuf {
        self.dir.join("filler")
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
