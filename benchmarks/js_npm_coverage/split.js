// Usage: node split.js packages.txt > statements.json
const fs = require('fs'), path = require('path');
const acorn = require('acorn');
const lines = fs.readFileSync(process.argv[2], 'utf8').split('\n').map(s => s.trim()).filter(Boolean);
const out = { statements: [], files: [], errors: [] };
for (const spec of lines) {
  const at = spec.lastIndexOf('@');
  const name = spec.slice(0, at), version = spec.slice(at + 1);
  const dir = path.join(__dirname, 'node_modules', name);
  let pj;
  try { pj = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')); }
  catch (e) { out.errors.push({ package: spec, error: 'not installed' }); continue; }
  if (pj.version !== version) { out.errors.push({ package: spec, error: 'installed version ' + pj.version }); continue; }
  let main = pj.main || 'index.js';
  let file = path.join(dir, main);
  if (!fs.existsSync(file) || fs.statSync(file).isDirectory()) {
    if (fs.existsSync(file + '.js')) file = file + '.js';
    else if (fs.existsSync(path.join(file, 'index.js'))) file = path.join(file, 'index.js');
  }
  const src = fs.readFileSync(file, 'utf8');
  let ast;
  try { ast = acorn.parse(src, { ecmaVersion: 2023, sourceType: 'script', allowHashBang: true }); }
  catch (e) { out.errors.push({ package: spec, error: 'acorn: ' + e.message }); continue; }
  // Regex literals, for the secondary "regex masked" measurement: each replaced by the identifier __re__.
  const regexes = [];
  (function walk(n) {
    if (!n || typeof n.type !== 'string') return;
    if (n.type === 'Literal' && n.regex) regexes.push([n.start, n.end]);
    for (const k of Object.keys(n)) {
      const v = n[k];
      if (Array.isArray(v)) v.forEach(walk); else if (v && typeof v === 'object') walk(v);
    }
  })(ast);
  const mask = (a, b) => {
    let t = '', p = a;
    for (const [s, e] of regexes) if (s >= a && e <= b) { t += src.slice(p, s) + '__re__'; p = e; }
    return t + src.slice(p, b);
  };
  const nre = (a, b) => regexes.filter(([s, e]) => s >= a && e <= b).length;
  out.files.push({ package: spec, main: path.relative(dir, file), text: src, masked: mask(0, src.length), regexes: regexes.length, regex_starts: regexes.map(([s]) => s) });
  ast.body.forEach((node, i) => out.statements.push({ package: spec, index: i, text: src.slice(node.start, node.end),
    masked: mask(node.start, node.end), regexes: nre(node.start, node.end),
    regex_starts: regexes.filter(([s, e]) => s >= node.start && e <= node.end).map(([s]) => s - node.start) }));
}
process.stdout.write(JSON.stringify(out));
