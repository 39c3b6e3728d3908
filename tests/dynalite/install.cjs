// Installs dynalite's pinned packages from tests/dynalite/vendor into <dest>/node_modules as
// package-lock.json lays them out (flat; the optional native leveldown left out), each tarball
// checked against the lock's integrity first. Not `npm ci`: Debian 12's npm 9.2 cannot read
// package.json's overrides of file: tarballs ("Invalid comparator: file:vendor/..."), and
// without them two packages would need versions that are not vendored.
//   node tests/dynalite/install.cjs tests/dynalite build/tools/dynalite
'use strict';
const fs = require('fs');
const path = require('path');
const crypto = require('crypto');
const { execFileSync } = require('child_process');

const [src, dest] = process.argv.slice(2);
const lock = JSON.parse(fs.readFileSync(path.join(src, 'package-lock.json'), 'utf8'));
let installed = 0;
for (const [where, pkg] of Object.entries(lock.packages)) {
  if (where === '' || pkg.optional) continue;
  const vendored = /^file:(vendor\/[^/]+\.tgz)$/.exec(pkg.resolved || '');
  if (!vendored) throw new Error(`${where}: not a vendored tarball (${pkg.resolved})`);
  const file = path.join(src, vendored[1]);
  const dash = pkg.integrity.indexOf('-');
  const algorithm = pkg.integrity.slice(0, dash);
  const digest = crypto.createHash(algorithm).update(fs.readFileSync(file)).digest('base64');
  if (digest !== pkg.integrity.slice(dash + 1)) {
    throw new Error(`${file}: its ${algorithm} is not the lock's`);
  }
  const target = path.join(dest, where);
  fs.mkdirSync(target, { recursive: true });
  execFileSync('tar', ['-xzf', file, '-C', target, '--strip-components=1', '--no-same-owner']);
  installed += 1;
}
process.stderr.write(`dynalite: ${installed} packages installed from tests/dynalite/vendor\n`);
