// A replay followed to its confirmation in a real browser (Debian's chromium, driven by
// playwright-core): sign in, replay a record, see it replaying; its job fails again (done by the
// Rust test, as a worker would), the record says so and links the new one; replay that one, its
// job's effect done, it reads confirmed with when. An amended replay shows both payloads. After
// each step it prints `step NAME` and waits for the Rust test to answer `ok`.
//
// Environment: DASHBOARD (base URL), TOKEN, REDRIVE_CHROMIUM, REDRIVE_PLAYWRIGHT (node_modules
// holding playwright-core), SCREENSHOTS (a directory), FIRST (the record to replay), AMENDED (a
// record replayed with an amended payload and confirmed).

const path = require('path');
const readline = require('readline');
const { chromium } = require(path.join(process.env.REDRIVE_PLAYWRIGHT, 'playwright-core'));

const base = process.env.DASHBOARD;
const shots = process.env.SCREENSHOTS;
const stdin = readline.createInterface({ input: process.stdin });
const answers = stdin[Symbol.asyncIterator]();

function check(condition, message) {
  if (!condition) throw new Error(message);
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(shots, `replays-${name}.png`), fullPage: true });
}

async function step(name) {
  console.log(`step ${name}`);
  const { value, done } = await answers.next();
  check(!done && value.trim() === 'ok', `the store disagrees after ${name}: ${value}`);
}

async function replay(page, id, reason) {
  await page.goto(`${base}/records/${id}`);
  await page.click('#replay');
  await page.fill('input[name=by]', 'grace');
  await page.fill('input[name=reason]', reason);
  await page.click('#confirm');
  await page.waitForSelector('#notice');
  check((await page.textContent('#notice')).includes('confirmed once its effect is done'), await page.textContent('#notice'));
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.REDRIVE_CHROMIUM,
    args: ['--no-sandbox', '--disable-dev-shm-usage'],
  });
  try {
    const page = await browser.newPage();
    const dialogs = [];
    page.on('dialog', async (d) => { dialogs.push(d.message()); await d.dismiss(); });
    await page.goto(`${base}/records`);
    await page.fill('input[name=token]', process.env.TOKEN);
    await page.click('button[type=submit]');
    await page.waitForSelector('#records');

    // Replayed while its cause remains: replaying, not confirmed.
    const first = process.env.FIRST;
    await replay(page, first, 'try again');
    const replaying = await page.textContent('#state');
    check(replaying.includes('replaying since') && replaying.includes('waiting for its job'), replaying);
    await shot(page, '01-replaying');
    await step('replayed');

    // Its job failed again: the record says so and links the new one, which links back.
    await page.goto(`${base}/records/${first}`);
    const failed = await page.textContent('#state');
    check(failed.includes('failed again'), failed);
    await shot(page, '02-failed-again');
    await page.click('#next');
    await page.waitForSelector('#replay-of');
    check((await page.textContent('#replay-of')).includes(`record ${first}`), await page.textContent('#replay-of'));
    const second = page.url().split('/records/')[1];
    await shot(page, '03-next-record');

    // The cause fixed: replay the new record; its job's effect done, it reads confirmed.
    await replay(page, second, 'carrier back');
    await step('replayed-again');
    await page.goto(`${base}/records/${second}`);
    const confirmed = await page.textContent('#state');
    check(confirmed.includes('confirmed') && confirmed.includes('its effect done once') && confirmed.includes('by grace: carrier back'), confirmed);
    await shot(page, '04-confirmed');

    // An amended replay: both payloads shown, the record confirmed.
    await page.goto(`${base}/records/${process.env.AMENDED}`);
    check((await page.textContent('#amended')).includes('8 Elm St'), await page.textContent('#amended'));
    check((await page.textContent('#payload')).includes('malformed'), await page.textContent('#payload'));
    check((await page.textContent('#state')).includes('with an amended payload'), await page.textContent('#state'));
    await shot(page, '05-amended');

    // The audit trail says how each replay ended.
    await page.goto(`${base}/audit`);
    const audit = await page.textContent('#closed');
    check(audit.includes('failed again as record') && audit.includes('replayed by grace: carrier back, confirmed'), audit);
    await shot(page, '06-audit');
    check(dialogs.length === 0, `a script ran: ${dialogs}`);
  } finally {
    await browser.close();
    stdin.close(); // else node waits on it for ever
  }
})().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
