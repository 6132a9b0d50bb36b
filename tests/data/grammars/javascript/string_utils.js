const escapeHtml = (s) =>
  String(s)
    .replaceAll('&', '&amp;')
    .replaceAll('<', '&lt;')
    .replaceAll('>', '&gt;')
    .replaceAll('"', '&quot;')
    .replaceAll("'", '&#39;');

function slugify(text) {
  return text
    .normalize('NFKD')
    .toLowerCase()
    .split('')
    .map((c) => ('abcdefghijklmnopqrstuvwxyz0123456789'.includes(c) ? c : '-'))
    .join('')
    .split('-')
    .filter(Boolean)
    .join('-');
}

function pad(value, width, char = ' ') {
  const s = String(value);
  return s.length >= width ? s : char.repeat(width - s.length) + s;
}

function formatBytes(bytes, decimals = 1) {
  if (bytes === 0) return '0 B';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  const i = Math.min(Math.floor(Math.log(bytes) / Math.log(1024)), units.length - 1);
  return `${(bytes / 1024 ** i).toFixed(decimals)} ${units[i]}`;
}

function template(str, data) {
  return str.split('{{').map((part, i) => {
    if (i === 0) return part;
    const [key, rest] = part.split('}}');
    return (data[key.trim()] ?? '') + rest;
  }).join('');
}

const quotes = ["double \"quoted\"", 'single \'quoted\'', 'tab\tnewline\nunicode\u00e9\u{1F600}', "\x41\\"];
const multi = `line one
line two with ${quotes.length} items and a \` backtick and a $ sign and $$ and $\{not}`;
const nested = `${pad(1, 3, '0')}-${formatBytes(2048)}-${slugify('Hello World!')}`;
const tagged = String.raw`C:\path\to\${'file'}.txt`;
const wrap = `outer ${ { a: 1 }.a } end`;

console.log(escapeHtml('<a href="x">'), template('Hi {{ name }}!', { name: 'Ada' }));
console.log(quotes, multi, nested, tagged, wrap);
