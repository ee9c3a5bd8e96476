// The Kinds page in a real browser (Debian's chromium, driven by playwright-core), as an operator
// uses it: sign in, pause a kind with a reason after the confirmation, see it listed with their
// name, limit it, resume it. After each step it prints `step NAME` and waits for the Rust test to
// answer `ok` once the store agrees. A pause posted from another origin must be refused.
//
// Environment: DASHBOARD (base URL), TOKEN, REDRIVE_CHROMIUM, REDRIVE_PLAYWRIGHT (node_modules
// holding playwright-core), SCREENSHOTS (a directory).

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
  await page.screenshot({ path: path.join(shots, `kinds-${name}.png`), fullPage: true });
}

// Lets the Rust test read the store; goes on once it says the store agrees.
async function step(name) {
  console.log(`step ${name}`);
  const { value, done } = await answers.next();
  check(!done && value.trim() === 'ok', `the store disagrees after ${name}: ${value}`);
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

    await page.goto(`${base}/kinds`);
    check(page.url().includes('/login'), `not sent to sign in: ${page.url()}`);
    await page.fill('input[name=token]', process.env.TOKEN);
    await page.click('button[type=submit]');
    await page.waitForSelector('#no-paused');
    await shot(page, '01-none-paused');

    // Pause a kind: its name, then the confirmation with a reason and a name.
    await page.fill('#pause-another input[name=kind]', 'charge_order');
    await page.click('#pause-another button:text-is("Pause…")');
    await page.waitForSelector('#confirm');
    await page.fill('input[name=reason]', 'provider down since 14:02');
    await page.fill('input[name=by]', 'ada');
    await shot(page, '02-pause-confirm');
    await page.click('#confirm');
    await page.waitForSelector('#notice');
    const paused = await page.textContent('#paused');
    check(paused.includes('charge_order') && paused.includes('ada') && paused.includes('provider down since 14:02'), paused);
    await shot(page, '03-paused');
    await step('paused');

    // The overview lists it too.
    await page.click('header a:text-is("Overview")');
    await page.waitForSelector('#depth');
    const overview = await page.textContent('#paused');
    check(overview.includes('charge_order') && overview.includes('ada'), overview);
    await page.click('a:text-is("Resume, pause and limit kinds")');
    await page.waitForSelector('#kinds');

    // A pause of another kind posted from another origin with the operator's browser: refused.
    const forged = await browser.newPage();
    await forged.setContent(`<form method="post" action="${base}/kinds/pause">
      <input name="kind" value="ship"><input name="reason" value="forged"><input name="by" value="mallory">
      <button>go</button></form>`);
    await Promise.all([forged.waitForNavigation(), forged.click('button')]);
    check(!(await forged.content()).includes('Paused ship'), 'a cross-site post was accepted');
    await forged.close();

    // Limits, from the kind's row.
    await page.goto(`${base}/kinds`);
    await page.click('#kinds a:text-is("Limits…")');
    await page.fill('input[name=concurrency]', '5');
    await page.fill('input[name=rate]', '100/1s');
    await page.fill('input[name=by]', 'ada');
    await shot(page, '04-limits');
    await page.click('#confirm');
    await page.waitForSelector('#notice');
    const kinds = await page.textContent('#kinds');
    check(kinds.includes('5 at once, 100/1s'), kinds);
    await step('limited');

    // Resume, with a name.
    await page.fill('#paused input[name=by]', 'grace');
    await page.click('#paused button:text-is("Resume")');
    await page.waitForSelector('#no-paused');
    check((await page.textContent('#notice')).includes('Resumed charge_order'), await page.textContent('#notice'));
    const history = await page.textContent('#history');
    check(history.includes('resumed') && history.includes('grace') && history.includes('paused'), history);
    await shot(page, '05-resumed');
    await step('resumed');
    check(dialogs.length === 0, `a script ran: ${dialogs}`);
  } finally {
    await browser.close();
    stdin.close(); // else node waits on it for ever
  }
})().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
