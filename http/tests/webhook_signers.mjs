// Signs webhook deliveries with the providers' own libraries, for the inbox's tests:
// node webhook_signers.mjs <node_modules dir> < cases.json > signatures.json
// Each case is {lib, secret, payload, timestamp?, id?}; each answer the header value the
// provider would send: Stripe's Node SDK (stripe), Octokit (@octokit/webhooks-methods, GitHub's
// own), Standard Webhooks' own package (standardwebhooks).
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const dir = process.argv[2];
const require = createRequire(join(dir, 'index.js'));
const Stripe = require('stripe');
const { Webhook } = require('standardwebhooks');
const octokitPkg = JSON.parse(readFileSync(join(dir, '@octokit/webhooks-methods/package.json'), 'utf8'));
const octokit = await import(pathToFileURL(join(dir, '@octokit/webhooks-methods', octokitPkg.exports['.'].node.import)).href);

const stripe = new Stripe('sk_test_unused'); // makes no request: only its webhooks helper is used
const cases = JSON.parse(readFileSync(0, 'utf8'));
const out = [];
for (const c of cases) {
  switch (c.lib) {
    case 'stripe':
      out.push(stripe.webhooks.generateTestHeaderString({ payload: c.payload, secret: c.secret, timestamp: c.timestamp }));
      break;
    case 'github':
      out.push(await octokit.sign(c.secret, c.payload));
      break;
    case 'standard':
      out.push(new Webhook(c.secret).sign(c.id, new Date(c.timestamp * 1000), c.payload));
      break;
    default:
      throw new Error(`unknown library ${c.lib}`);
  }
}
process.stdout.write(JSON.stringify(out));
