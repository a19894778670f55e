"""Diagnostic: does loading an AOTInductor package on CUDA crash depending on what was imported first?"""
import os, shutil, subprocess, sys, pathlib
OUT = pathlib.Path("/tmp/diag")
COMPILE = r'''
import sys, torch
class Triv(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.l = torch.nn.Linear(64, 64)
    def forward(self, x):
        return torch.relu(self.l(x)) * 2
ep = torch.export.export(Triv().cuda(), (torch.randn(8, 64, device="cuda"),))
torch._inductor.aoti_compile_and_package(ep, package_path=sys.argv[1])
print("compiled", flush=True)
'''
LOAD = r'''
import sys, importlib
for name in sys.argv[2:]:
    importlib.import_module(name)
import torch
r = torch._inductor.aoti_load_package(sys.argv[1])
print("loaded ok", r(torch.randn(8, 64, device="cuda")).shape, flush=True)
'''
shutil.rmtree(OUT, ignore_errors=True); OUT.mkdir()
pkg = str(OUT / "triv.pt2")
p = subprocess.run([sys.executable, "-c", COMPILE, pkg], capture_output=True, text=True)
print("compile rc", p.returncode, p.stdout[-100:], p.stderr[-2500:] if p.returncode else "", flush=True)
for first in ([], ["transformers"], ["sklearn"], ["scipy.linalg"], ["tokenizers"], ["safetensors"], ["tqdm"],
              ["graphllm.ops.attention"]):
    p = subprocess.run([sys.executable, "-c", LOAD, pkg, *first], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    print(f"imports first {first}: rc={p.returncode} {p.stdout.strip()[-60:]} {p.stderr.strip()[-300:] if p.returncode not in (0, -11) else ''}", flush=True)
p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", LOAD, pkg], capture_output=True, text=True)
print("faulthandler:", p.stderr[-1200:])
print(subprocess.run("env | grep -i -E 'LD_|TORCH|CUDA|PYTHON' ; pip list 2>/dev/null | grep -i -E '^torch|triton|nvidia-cuda-runtime'", shell=True, capture_output=True, text=True).stdout)
