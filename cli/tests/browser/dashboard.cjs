// The dashboard in a real browser (Debian's chromium, driven by playwright-core), as an operator
// uses it: sign in, read the overview, open a record, discard one with a reason, replay another,
// read the audit trail, find records by their error text and discard them together, sign out. A form posted from another origin must be refused. Prints what it did as
// JSON on the last line; the Rust test checks the backend.
//
// Environment: DASHBOARD (base URL), TOKEN, REDRIVE_CHROMIUM, REDRIVE_PLAYWRIGHT (node_modules
// holding playwright-core), SCREENSHOTS (a directory).

const path = require('path');
const { chromium } = require(path.join(process.env.REDRIVE_PLAYWRIGHT, 'playwright-core'));

const base = process.env.DASHBOARD;
const shots = process.env.SCREENSHOTS;

function check(condition, message) {
  if (!condition) throw new Error(message);
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(shots, `${name}.png`), fullPage: true });
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.REDRIVE_CHROMIUM,
    args: ['--no-sandbox', '--disable-dev-shm-usage'],
  });
  const done = {};
  try {
    const page = await browser.newPage();
    const dialogs = [];
    page.on('dialog', async (d) => { dialogs.push(d.message()); await d.dismiss(); });

    // Signing in: every page sends there first.
    await page.goto(`${base}/`);
    check(page.url().includes('/login'), `not sent to sign in: ${page.url()}`);
    await shot(page, '01-sign-in');
    await page.fill('input[name=token]', 'wrong-token-wrong-token');
    await page.click('button[type=submit]');
    await page.waitForSelector('#refused', { timeout: 5000 }); // "not the dashboard's token"
    await page.fill('input[name=token]', process.env.TOKEN);
    await page.click('button[type=submit]');

    // The overview: depth, and open records by kind and severity.
    await page.waitForSelector('#groups');
    const groups = await page.textContent('#groups');
    check(groups.includes('charge') && groups.includes('critical') && groups.includes('ship'), groups);
    check((await page.textContent('#depth')).includes('open records'), 'no queue depth');
    await shot(page, '02-overview');

    // The ship records, then the first one: payload beside its errors, markup shown as text.
    await page.click('#groups a:text-is("ship")');
    await page.waitForSelector('#records');
    await shot(page, '03-records');
    const firstLink = page.locator('#records a').first();
    done.discarded = (await firstLink.textContent()).trim();
    await firstLink.click();
    await page.waitForSelector('#payload');
    const payload = await page.textContent('#payload');
    check(payload.includes('"note": "<script>alert(\\"payload\\")</script>"'), `payload not shown as text: ${payload}`);
    check((await page.textContent('#errors')).includes('carrier said no'), 'no error history');
    await shot(page, '04-record');

    // A form from another origin, posted with the operator's browser: refused, nothing changes.
    const recordUrl = page.url();
    const forged = await browser.newPage();
    await forged.setContent(`<form method="post" action="${base}/records/${done.discarded}/discard">
      <input name="reason" value="forged"><input name="by" value="mallory"><button>go</button></form>`);
    await Promise.all([forged.waitForNavigation(), forged.click('button')]);
    check(!(await forged.content()).includes('Discarded.'), 'a cross-site post was accepted');
    await forged.close();
    await page.goto(recordUrl);
    check((await page.textContent('#state')).trim() === 'open', 'the forged post changed the record');

    // Discard, with a reason and a name, after the confirmation page.
    await page.click('#discard');
    await page.fill('input[name=reason]', 'refunded by hand');
    await page.fill('input[name=by]', 'ada');
    await shot(page, '05-discard-confirm');
    await page.click('#confirm');
    await page.waitForSelector('#notice');
    check((await page.textContent('#state')).includes('discarded'), 'not discarded');
    await shot(page, '06-discarded');

    // Replay another open record.
    await page.goto(`${base}/records?kind=ship`);
    const next = page.locator('#records a').first();
    done.replayed = (await next.textContent()).trim();
    check(done.replayed !== done.discarded, 'a discarded record is still listed as open');
    await next.click();
    await page.click('#replay');
    await page.fill('input[name=by]', 'grace');
    await page.fill('input[name=reason]', 'carrier back');
    await shot(page, '07-replay-confirm');
    await page.click('#confirm');
    await page.waitForSelector('#notice');
    check((await page.textContent('#notice')).includes('Replayed'), await page.textContent('#notice'));
    await shot(page, '08-replayed');

    // The audit trail names both.
    await page.goto(`${base}/audit`);
    const audit = await page.textContent('#closed');
    check(audit.includes('discarded by ada: refunded by hand') && audit.includes('replayed by grace: carrier back'), audit);
    await shot(page, '09-audit');

    // Records found by their error text (its % as itself), then discarded together after the
    // bulk confirmation.
    await page.goto(`${base}/records`);
    await page.fill('#search input[name=error]', 'MAILBOX FULL (QUOTA 100%)');
    await page.click('#search button[type=submit]');
    await page.waitForSelector('#records');
    const found = await page.locator('#records a').allTextContents();
    check(found.length === 2, `the error search found ${found.length} records: ${found}`);
    check((await page.textContent('#records')).includes('mailbox full'), 'the found records show their error');
    done.bulk_discarded = found.map((id) => id.trim());
    await shot(page, '11-error-search');
    await page.click('#bulk-discard');
    check((await page.textContent('#matching')).startsWith('2 '), await page.textContent('#matching'));
    await page.fill('input[name=reason]', 'the addresses are gone');
    await page.fill('input[name=by]', 'ada');
    await shot(page, '12-bulk-discard-confirm');
    await page.click('#confirm');
    await page.waitForSelector('#status.notice', { timeout: 10000 });
    check((await page.textContent('#discarded')).trim() === '2', await page.textContent('#progress'));
    await shot(page, '13-bulk-discarded');
    await page.goto(`${base}/records?error=${encodeURIComponent('mailbox full')}`);
    await page.waitForSelector('#no-records');

    // Sign out: the header's link, then the button; every page asks to sign in again.
    await page.click('header a:text-is("Sign out")');
    await shot(page, '10-sign-out');
    await page.click('#sign-out');
    await page.waitForURL(/\/login/);
    await page.goto(`${base}/records`);
    check(page.url().includes('/login'), `still signed in after signing out: ${page.url()}`);
    check(dialogs.length === 0, `a script ran: ${dialogs}`);
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(done));
})().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
