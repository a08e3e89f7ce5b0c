"""Compare two outputs of benchmarks/same_outputs.sh: sha256 per file (paths recorded inside
JSON replaced by OUT), metrics.jsonl's step/loss/accuracy/grad_norm/lr, and with --params the
checkpoint's parameters bitwise (benchmarks/README.md, "Issue 24 layout: same outputs").

    python benchmarks/same_outputs.py BEFORE_OUT AFTER_OUT [--params]
"""
import hashlib, json, pathlib, sys
B, A = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def norm(p, root):
    data = p.read_bytes()
    if p.suffix in ('.json', '') and b'{' in data[:2] or p.name in ('metadata',):
        data = data.replace(str(root).encode(), b'OUT')
    return data
rows = []
files = sorted(p.relative_to(B) for p in B.rglob('*') if p.is_file())
for rel in files:
    s = str(rel)
    if 'tensorboard/events' in s or '_CHECKPOINT_METADATA' in s or '/state/' in s or s.endswith('commit_success.txt'):
        continue
    b, a = B / rel, A / rel
    if not a.exists():
        rows.append((s, 'MISSING after', '')); continue
    if s.endswith('stats.json'):
        jb, ja = json.loads(b.read_text()), json.loads(a.read_text())
        for j in (jb, ja):
            j.pop('elapsed_seconds', None)
        same = json.dumps(jb, sort_keys=True).replace(str(B), 'OUT') == json.dumps(ja, sort_keys=True).replace(str(A), 'OUT')
        rows.append((s + ' (without elapsed_seconds, paths)', 'same' if same else 'DIFFERENT', '')); continue
    if s.endswith('metrics.jsonl'):
        keys = ('step', 'loss', 'accuracy', 'grad_norm', 'learning_rate', 'validation_loss', 'validation_accuracy')
        lb = [{k: r.get(k) for k in keys} for r in map(json.loads, b.read_text().splitlines())]
        la = [{k: r.get(k) for k in keys} for r in map(json.loads, a.read_text().splitlines())]
        if lb != la:  # how far apart: float rounding, or another computation
            gap = max(abs(x[k] - y[k]) for x, y in zip(lb, la) for k in keys if isinstance(x[k], float))
            rows.append((s + ' largest difference', f'{gap:.2e}', ''))
        h = lambda l: hashlib.sha256(json.dumps(l).encode()).hexdigest()[:16]
        rows.append((s + ' (step, loss, accuracy, grad_norm, lr, validation)', 'same' if lb == la else 'DIFFERENT', f'{h(lb)} / {h(la)}'))
        continue
    hb = hashlib.sha256(norm(b, B)).hexdigest()[:16]; ha = hashlib.sha256(norm(a, A)).hexdigest()[:16]
    rows.append((s, 'same' if hb == ha else 'DIFFERENT', f'{hb} / {ha}'))
for r in rows:
    print(' | '.join(r))

if '--params' in sys.argv:
    import jax, numpy as np
    from pmi_jax import checkpoints
    pb = checkpoints.restore_for_eval(str(B / 'runs/pmi'))[1]
    pa = checkpoints.restore_for_eval(str(A / 'runs/pmi'))[1]
    lb, la = jax.tree.leaves(pb), jax.tree.leaves(pa)
    same = len(lb) == len(la) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(lb, la))
    digest = lambda l: hashlib.sha256(b''.join(np.asarray(x).tobytes() for x in l)).hexdigest()[:16]
    print(f'runs/pmi/checkpoints/30/state params ({len(lb)} arrays, bitwise) | {"same" if same else "DIFFERENT"} | {digest(lb)} / {digest(la)}')
