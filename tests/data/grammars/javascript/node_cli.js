const fs = require('fs');
const { promisify } = require('util');
const readFile = promisify(fs.readFile);

function parseArgs(argv) {
  const args = { _: [], flags: {} };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--') {
      args._.push(...argv.slice(i + 1));
      break;
    } else if (arg.startsWith('--')) {
      const [name, value] = arg.slice(2).split('=');
      args.flags[name] = value ?? (argv[i + 1] && !argv[i + 1].startsWith('-') ? argv[++i] : true);
    } else if (arg.startsWith('-') && arg.length > 1) {
      for (const ch of arg.slice(1)) args.flags[ch] = true;
    } else {
      args._.push(arg);
    }
  }
  return args;
}

async function countLines(files) {
  const counts = {};
  await Promise.all(
    files.map(async (file) => {
      try {
        const text = await readFile(file, 'utf8');
        counts[file] = text.split('\n').length - (text.endsWith('\n') ? 1 : 0);
      } catch (err) {
        counts[file] = err.code === 'ENOENT' ? 'missing' : err.message;
      }
    }),
  );
  return counts;
}

function usage() {
  return [
    'usage: count [options] FILE...',
    '',
    '  -h, --help     show this help',
    '  --json         print JSON',
  ].join('\n');
}

async function main() {
  const { _: files, flags } = parseArgs(process.argv.slice(2));
  if (flags.h || flags.help || files.length === 0) {
    console.log(usage());
    process.exitCode = files.length === 0 ? 1 : 0;
    return;
  }
  const counts = await countLines(files);
  if (flags.json) {
    process.stdout.write(JSON.stringify(counts, null, 2) + '\n');
  } else {
    for (const [file, n] of Object.entries(counts)) console.log(`${String(n).padStart(8)} ${file}`);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
