#!/usr/bin/env python3
"""Makes the fixture trees of hip-doctor's Python stack tests (hip-doctor/tests/fixtures/python).

Each case is a site-packages directory laid out as pip writes it: `<name>-<version>.dist-info/`
with METADATA, RECORD (path,sha256=<urlsafe base64, no padding>,size; RECORD's own line has
empty fields), INSTALLER and WHEEL; the package's files beside it. `torch/version.py` is written
the way PyTorch's tools/generate_torch_version.py writes it (a ROCm/DTK build has `hip` set and
`cuda` None; a CUDA build the reverse).

The shared libraries are built by hipcc (ROCm's clang) for the archs each case needs, and kept
tiny (one empty kernel). Two sonames hipcc cannot link against here (libgalaxyhip.so.5, DTK's
HIP runtime; libamdhip64.so.6, ROCm 6's) are link-time stubs made with clang, so the libraries
carry the DT_NEEDED entries real DTK / ROCm 6 builds have. The compressed-bundle case replaces
the plain bundle in `.hip_fatbin` by a `CCOB` (clang's compressed offload bundle, version 2:
magic, u16 version, u16 method (0 zlib, 1 zstd), u32 total size, u32 uncompressed size, u64
hash, data) compressed with the zstd command and with zlib.

Needs: python3, hipcc, clang, zstd. Run from the repository root:
    python3 tools/doctor_fixtures/make.py
The output is committed; CI only reads it.
"""

import base64
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

CLANG = shutil.which("clang") or "clang-15"
ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "hip-doctor" / "tests" / "fixtures" / "python"

KERNEL = """
#include <hip/hip_runtime.h>
extern "C" __global__ void fixture_kernel(float* x) { x[threadIdx.x] += 1.0f; }
extern "C" int fixture_entry() { return 0; }
"""


def run(*cmd, cwd=None):
    subprocess.run(cmd, check=True, cwd=cwd)


class Builder:
    """Builds the tiny shared libraries once, in a temporary directory."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        (tmp / "k.hip").write_text(KERNEL)
        self.stubs = tmp / "stubs"
        self.stubs.mkdir()
        for soname in ["libgalaxyhip.so.5", "libamdhip64.so.6"]:
            src = tmp / "stub.c"
            src.write_text("int fixture_stub;\n")
            run(CLANG, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(self.stubs / soname), str(src))

    def hip_lib(self, name: str, archs, needs=()) -> bytes:
        """A shared library with GPU code for `archs`, needing libamdhip64.so.5 (hipcc's) and
        the stub sonames in `needs`."""
        out = self.tmp / name
        cmd = ["hipcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(self.tmp / "k.hip")]
        cmd += [f"--offload-arch={a}" for a in archs]
        if needs:
            cmd += ["-Wl,--no-as-needed", f"-L{self.stubs}"] + [f"-l:{n}" for n in needs]
        cmd += ["-Wl,-s"]
        run(*cmd)
        return out.read_bytes()

    def two_unit_lib(self, name: str, archs_a, archs_b) -> bytes:
        """A library linked from two translation units compiled for different archs: its
        `.hip_fatbin` holds two bundles (the linker pads them apart)."""
        objs = []
        for i, archs in enumerate([archs_a, archs_b]):
            src = self.tmp / f"unit{i}.hip"
            src.write_text(KERNEL.replace("fixture_", f"fixture{i}_"))
            obj = self.tmp / f"unit{i}.o"
            run("hipcc", "-c", "-fPIC", "-O1", "-o", str(obj), str(src),
                *[f"--offload-arch={a}" for a in archs])
            objs.append(str(obj))
        out = self.tmp / name
        run("hipcc", "-shared", "-fPIC", "-o", str(out), *objs, "-Wl,-s")
        return out.read_bytes()

    def host_lib(self, name: str, needs=()) -> bytes:
        """A plain host library (no GPU code), optionally needing stub sonames."""
        src = self.tmp / "host.c"
        src.write_text("int fixture_host(void) { return 1; }\n")
        out = self.tmp / name
        cmd = [CLANG, "-shared", "-fPIC", "-O1", "-o", str(out), str(src), "-Wl,-s"]
        if needs:
            cmd += ["-Wl,--no-as-needed", f"-L{self.stubs}"] + [f"-l:{n}" for n in needs]
        run(*cmd)
        return out.read_bytes()


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def install(site: Path, name: str, version: str, files: dict, requires=(), top_level=None):
    """Writes one distribution as pip does: its files, then its .dist-info with a RECORD."""
    dist_info = site / f"{name}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
            "Summary: hip-doctor fixture"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    info_files = {
        "METADATA": ("\n".join(meta) + "\n\n").encode(),
        "INSTALLER": b"pip\n",
        "WHEEL": b"Wheel-Version: 1.0\nGenerator: hip-doctor-fixture\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n\n",
        "top_level.txt": ((top_level or name) + "\n").encode(),
    }
    lines = []
    for rel, data in sorted(files.items()):
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        lines.append(f"{rel},{record_hash(data)},{len(data)}")
    for rel, data in info_files.items():
        (dist_info / rel).write_bytes(data)
        lines.append(f"{dist_info.name}/{rel},{record_hash(data)},{len(data)}")
    lines.append(f"{dist_info.name}/RECORD,,")
    (dist_info / "RECORD").write_text("\n".join(lines) + "\n")


def version_py(version: str, cuda, hip) -> bytes:
    """torch/version.py as tools/generate_torch_version.py writes it."""
    return (
        "from typing import Optional\n\n"
        "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
        f"__version__ = '{version}'\n"
        "debug = False\n"
        f"cuda: Optional[str] = {cuda!r}\n"
        "git_version = 'Unknown'\n"
        f"hip: Optional[str] = {hip!r}\n"
    ).encode()


def torch_files(version, cuda, hip, libs):
    files = {
        "torch/__init__.py": b"",
        "torch/version.py": version_py(version, cuda, hip),
    }
    files.update({f"torch/lib/{k}": v for k, v in libs.items()})
    return files


def compress_fatbin(lib: bytes, method: str) -> bytes:
    """Replaces the plain bundle at the start of `.hip_fatbin` by a version 2 CCOB of it."""
    data = bytearray(lib)
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def section(i):
        base = shoff + i * shentsize
        name, _type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", data, base)
        return name, offset, size

    _, str_off, _ = section(shstrndx)
    for i in range(shnum):
        name, offset, size = section(i)
        end = data.index(b"\0", str_off + name)
        if bytes(data[str_off + name:end]) == b".hip_fatbin":
            break
    else:
        raise SystemExit("no .hip_fatbin")
    body = bytes(data[offset:offset + size])
    assert body.startswith(b"__CLANG_OFFLOAD_BUNDLE__")
    (count,) = struct.unpack_from("<Q", body, 24)
    pos, bundle_end = 32, 32
    for _ in range(count):
        e_off, e_size, id_len = struct.unpack_from("<QQQ", body, pos)
        pos += 24 + id_len
        bundle_end = max(bundle_end, e_off + e_size)
    plain = body[:bundle_end]
    if method == "zstd":
        packed = subprocess.run(["zstd", "-q", "-c", "-3"], input=plain, check=True,
                                capture_output=True).stdout
        method_id = 1
    else:
        packed = zlib.compress(plain, 6)
        method_id = 0
    digest = hashlib.md5(plain).digest()
    (low,) = struct.unpack_from("<Q", digest, 0)
    header = b"CCOB" + struct.pack("<HHIIQ", 2, method_id, 24 + len(packed), len(plain), low)
    ccob = header + packed
    assert len(ccob) <= size, "the compressed bundle must fit where the plain one was"
    data[offset:offset + size] = ccob + bytes(size - len(ccob))
    return bytes(data)


def main():
    for tool in ["hipcc", CLANG, "zstd"]:
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed")
    if OUT.exists():
        shutil.rmtree(OUT)
    with tempfile.TemporaryDirectory() as t:
        b = Builder(Path(t))
        torch_hip_906 = b.hip_lib("libtorch_hip.so", ["gfx906"], needs=["libgalaxyhip.so.5"])
        c10 = b.host_lib("libc10.so")

        # 1. A DTK build that fits (DTK 25.04 torch, gfx906 code, torchvision for it).
        site = OUT / "dtk_fits" / "site-packages"
        install(site, "torch", "2.4.1+das.opt2.dtk2504",
                torch_files("2.4.1+das.opt2.dtk2504", None, "6.3.25024-b4e4bb3",
                            {"libtorch_hip.so": torch_hip_906, "libc10.so": c10}),
                requires=["filelock", "typing-extensions>=4.8.0"])
        install(site, "torchvision", "0.19.1+das.opt2.dtk2504",
                {"torchvision/__init__.py": b"", "torchvision/_C.so": c10},
                requires=["numpy", "torch (==2.4.1)"])

        # 2. The CUDA wheel from PyPI (the layout of the real one: the local label only in
        #    version.py, METADATA says 2.15.0).
        site = OUT / "cuda_wheel" / "site-packages"
        install(site, "torch", "2.15.0",
                torch_files("2.15.0+cu132", "13.2", None, {"libc10.so": c10}),
                requires=["filelock", 'triton~=3.9.0; platform_system == "Linux"'])

        # 3. A DTK 25.04 build (the test says DTK 26.04 is installed).
        site = OUT / "dtk_other" / "site-packages"
        install(site, "torch", "2.4.1+das.opt2.dtk2504",
                torch_files("2.4.1+das.opt2.dtk2504", None, "6.3.25024-b4e4bb3",
                            {"libtorch_hip.so": torch_hip_906}))

        # 4. torchvision (and xformers) built for another torch.
        site = OUT / "torchvision_other" / "site-packages"
        install(site, "torch", "2.5.1+das.opt1.dtk2504",
                torch_files("2.5.1+das.opt1.dtk2504", None, "6.3.25024-b4e4bb3", {}))
        install(site, "torchvision", "0.19.1+das.opt2.dtk2504",
                {"torchvision/__init__.py": b"", "torchvision/_C.so": c10},
                requires=["numpy", "torch (==2.4.1)"])
        install(site, "xformers", "0.0.28+das.opt1.dtk2504.torch241",
                {"xformers/__init__.py": b""}, requires=["torch"])

        # 5. flash-attn for gfx90a only (the test's node is gfx906).
        site = OUT / "flash_attn_gfx90a" / "site-packages"
        fa = b.hip_lib("flash_attn_2_cuda.so", ["gfx90a"])
        two = b.two_unit_lib("layers.so", ["gfx906", "gfx90a"], ["gfx90a"])
        install(site, "flash_attn", "2.6.1+das.opt2.dtk2504",
                {"flash_attn/__init__.py": b"",
                 "flash_attn/layers_ext.so": two,
                 "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so": fa},
                requires=["torch", "einops"], top_level="flash_attn\nflash_attn_2_cuda")

        # 6. bitsandbytes without a ROCm library.
        site = OUT / "bnb_no_rocm" / "site-packages"
        install(site, "bitsandbytes", "0.43.3",
                {"bitsandbytes/__init__.py": b"",
                 "bitsandbytes/libbitsandbytes_cpu.so": c10,
                 "bitsandbytes/libbitsandbytes_cuda121.so": c10},
                requires=["torch", "numpy"])

        # 7. Libraries needing an absent libamdhip64.so.6 (a ROCm 6 build) and a
        #    libgalaxyhip.so.5 that only DTK's environment puts on the path.
        site = OUT / "missing_hip" / "site-packages"
        vllm_lib = b.host_lib("_C.so", needs=["libamdhip64.so.6"])
        deepspeed_lib = b.host_lib("fused_adam.so", needs=["libgalaxyhip.so.5"])
        install(site, "vllm", "0.6.2+rocm624",
                {"vllm/__init__.py": b"", "vllm/_C.abi3.so": vllm_lib}, requires=["torch"])
        install(site, "deepspeed", "0.14.2+das.opt2.dtk2504",
                {"deepspeed/__init__.py": b"", "deepspeed/ops/fused_adam_op.so": deepspeed_lib},
                requires=["torch"])

        # 8. Compressed bundles (zstd and zlib) holding gfx906 and gfx90a.
        site = OUT / "compressed" / "site-packages"
        both = b.hip_lib("both.so", ["gfx906", "gfx90a"])
        install(site, "xformers", "0.0.28+das.opt1.dtk2504.torch241",
                {"xformers/__init__.py": b"",
                 "xformers/_C.so": compress_fatbin(both, "zstd"),
                 "xformers/_C_flashattention.so": compress_fatbin(both, "zlib")})

        # 9. A truncated library and a file that is not ELF at all.
        site = OUT / "truncated" / "site-packages"
        install(site, "apex", "1.0+das.opt1.dtk2504",
                {"apex/__init__.py": b"",
                 "apex/fused_dense_cuda.so": torch_hip_906[: len(torch_hip_906) // 2],
                 "apex/amp_C.so": b"this is not an ELF file\n" * 4})

    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"wrote {OUT.relative_to(ROOT)} ({total} bytes)")


if __name__ == "__main__":
    main()
