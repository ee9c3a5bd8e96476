// The Jobs page in a real browser (Debian's chromium, driven by playwright-core), as an operator
// uses it: sign in, list the live jobs, filter them by state, open a job (its payload is shown as
// text, never run), cancel it after the confirmation with a reason and a name, and see it
// cancelled with them. A cancel posted from another origin must be refused. Prints the cancelled
// job's id as JSON on its last line.
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
  await page.screenshot({ path: path.join(shots, `jobs-${name}.png`), fullPage: true });
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

    await page.goto(`${base}/jobs`);
    check(page.url().includes('/login'), `not sent to sign in: ${page.url()}`);
    await page.fill('input[name=token]', process.env.TOKEN);
    await page.click('button[type=submit]');
    await page.waitForSelector('#jobs');
    const all = await page.textContent('#jobs');
    for (const state of ['queued', 'scheduled', 'running', 'failed']) {
      check(all.includes(state), `no ${state} job listed: ${all}`);
    }
    await shot(page, '01-list');

    // Only the scheduled ones.
    await page.selectOption('#filter select[name=state]', 'scheduled');
    await page.click('#filter button[type=submit]');
    await page.waitForURL(/state=scheduled/);
    const rows = await page.$$eval('#jobs tr td.state', (cells) => cells.map((c) => c.textContent));
    check(rows.length === 1 && rows[0] === 'scheduled', `the filter shows ${rows}`);
    await shot(page, '02-scheduled');

    // The job: its payload as text, its attempts.
    await page.click('#jobs a');
    await page.waitForSelector('#payload');
    const jobUrl = page.url();
    const id = decodeURIComponent(jobUrl.split('/jobs/')[1]);
    check((await page.textContent('#payload')).includes('<script>'), 'the payload is shown as text');
    check((await page.textContent('#state')) === 'scheduled', await page.textContent('#state'));
    await shot(page, '03-job');

    // A cancel posted from another origin with the operator's browser: refused.
    const forged = await browser.newPage();
    await forged.setContent(`<form method="post" action="${base}/jobs/${encodeURIComponent(id)}/cancel">
      <input name="reason" value="forged"><input name="by" value="mallory"><button>go</button></form>`);
    await Promise.all([forged.waitForNavigation(), forged.click('button')]);
    check(!(await forged.content()).includes('Cancelled:'), 'a cross-site post was accepted');
    await forged.close();
    await page.goto(jobUrl);
    check((await page.textContent('#state')) === 'scheduled', 'a cross-site post cancelled the job');

    // Cancel, after the confirmation.
    await page.click('#cancel');
    await page.waitForSelector('#confirm');
    await page.fill('input[name=reason]', 'the campaign was withdrawn');
    await page.fill('input[name=by]', 'ada');
    await shot(page, '04-cancel-confirm');
    await page.click('#confirm');
    await page.waitForSelector('#notice');
    check((await page.textContent('#state')) === 'cancelled', await page.textContent('#state'));
    const cancelled = await page.textContent('#cancelled');
    check(cancelled.includes('ada') && cancelled.includes('the campaign was withdrawn'), cancelled);
    check(!(await page.$('#cancel')), 'a cancelled job offers no cancel');
    await shot(page, '05-cancelled');

    // The list says so.
    await page.goto(`${base}/jobs?state=cancelled`);
    const listed = await page.textContent('#jobs');
    check(listed.includes('cancelled by ada'), listed);
    await shot(page, '06-cancelled-list');
    check(dialogs.length === 0, `a script ran: ${dialogs}`);
    console.log(JSON.stringify({ cancelled: id }));
  } finally {
    await browser.close();
  }
})().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
