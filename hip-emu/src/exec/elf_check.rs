//! A host build is checked before `dlopen`: the loader maps its segments straight from the
//! file, so a truncated `.so` (a build killed mid-write, a full disk) would kill the process
//! with SIGBUS on the first touch of a page past the end of the file. Here it is an error
//! naming the file instead.

use object::elf::{FileHeader64, PT_LOAD, SHT_NOBITS};
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};
use object::Endianness;
use std::path::Path;

/// The largest host build read for the check (they are a few MiB).
const MAX_BYTES: u64 = 1 << 30;

/// Check that `path` is a regular file holding a whole 64-bit ELF shared object: its header,
/// program headers and section headers inside the file, and every loaded segment's and every
/// section's bytes too.
pub(crate) fn check_shared_object(path: &Path) -> Result<(), String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let shown = path.display();
    let bad = |why: String| {
        Err(format!(
            "{shown} is not a whole host build ({why}): rebuild it (a build interrupted \
             mid-write, or a full disk, leaves such a file)"
        ))
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot open {shown}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat {shown}: {e}"))?;
    if !meta.is_file() {
        return bad("not a regular file".into());
    }
    let len = meta.len();
    if len > MAX_BYTES {
        return bad(format!("{len} bytes, more than {MAX_BYTES}"));
    }
    let mut data = Vec::with_capacity(len as usize);
    file.by_ref()
        .take(MAX_BYTES)
        .read_to_end(&mut data)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    let size = data.len() as u64;
    let header = match FileHeader64::<Endianness>::parse(&*data) {
        Ok(h) => h,
        Err(e) => return bad(format!("{size} bytes, no 64-bit ELF header: {e}")),
    };
    let endian = match header.endian() {
        Ok(e) => e,
        Err(e) => return bad(format!("ELF header: {e}")),
    };
    let segments = match header.program_headers(endian, &*data) {
        Ok(p) => p,
        Err(e) => {
            return bad(format!(
                "program headers past the end of its {size} bytes: {e}"
            ))
        }
    };
    for (i, ph) in segments.iter().enumerate() {
        let end = ph.p_offset(endian).checked_add(ph.p_filesz(endian));
        if ph.p_type(endian) == PT_LOAD && end.map_or(true, |e| e > size) {
            return bad(format!(
                "loadable segment {i} ends at byte {}, past the end of its {size} bytes",
                end.map_or("overflow".into(), |e| e.to_string())
            ));
        }
    }
    let sections = match header.section_headers(endian, &*data) {
        Ok(s) => s,
        Err(e) => {
            return bad(format!(
                "section headers past the end of its {size} bytes: {e}"
            ))
        }
    };
    for (i, sh) in sections.iter().enumerate() {
        let end = sh.sh_offset(endian).checked_add(sh.sh_size(endian));
        if sh.sh_type(endian) != SHT_NOBITS && end.map_or(true, |e| e > size) {
            return bad(format!("section {i} ends past the end of its {size} bytes"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary's own libc, a whole shared object.
    fn a_shared_object() -> std::path::PathBuf {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("libc.so") || p.contains("libc-"))
            .map(Into::into)
            .expect("libc is mapped")
    }

    #[test]
    fn a_truncated_shared_object_is_refused_naming_it() {
        let so = a_shared_object();
        assert_eq!(check_shared_object(&so), Ok(()));
        let bytes = std::fs::read(&so).unwrap();
        let dir = std::env::temp_dir().join(format!("hipemu-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for keep in [0, 10, 64, 4096, bytes.len() / 2, bytes.len() - 1] {
            let cut = dir.join(format!("cut{keep}.so"));
            std::fs::write(&cut, &bytes[..keep]).unwrap();
            let e = check_shared_object(&cut).unwrap_err();
            assert!(e.contains(&cut.display().to_string()), "{keep}: {e}");
            assert!(e.contains("not a whole host build"), "{keep}: {e}");
            // What hip-emu does with such a file under HIPK_EMU_KERNELS: an error, no SIGBUS.
            let e = crate::exec::host::load(&cut).err().unwrap();
            assert!(e.contains(&cut.display().to_string()), "{keep}: {e}");
        }
        let e = check_shared_object(&dir).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
