//! Unit tests of the engine: batch assembly and reply parsing, without a server.
use super::*;
use crate::policy::Algorithm;
use crate::store::redis::request::units;
use crate::store::redis::wire::parse_batch_reply;
use crate::Rate;

/// A connector that never connects: for tests of what would be sent and parsed.
struct Never;
impl Connector for Never {
    type Conn = redis::aio::MultiplexedConnection;
    type Lane = ();
    fn lane(&self, _: &str) {}
    async fn connection(&self) -> Result<Self::Conn, StoreError> {
        Err(StoreError::Connection("never".into()))
    }
    fn describe(&self) -> &'static str {
        "never"
    }
}

fn test_core() -> Core<Never> {
    let clock = crate::clock::ManualClock::new(1_234);
    Core::new(
        Never,
        Options {
            prefix: "t".into(),
            clock: Some(Arc::new(clock)),
            ..Options::default()
        },
    )
    .unwrap()
}

#[test]
fn a_batch_names_each_state_once_and_each_policy_once() {
    let core = test_core();
    let a = Policy::new("a", Rate::per_second(10)).unwrap();
    let b = Policy::builder("b", Rate::per_minute(5).with_burst(7))
        .algorithm(Algorithm::Gcra)
        .shape(Duration::from_millis(300))
        .build()
        .unwrap();
    let hot = Key::new("ip", "1.2.3.4");
    let other = Key::new("ip", "5.6.7.8");
    let batch = [
        core.request(&hot, &[a.clone(), b.clone()], units(&[1, 2]), Mode::Charge),
        core.request(&hot, std::slice::from_ref(&a), units(&[3]), Mode::Peek),
        core.request(&other, std::slice::from_ref(&a), units(&[1]), Mode::Refund),
    ];
    let parts = assemble(&batch);
    assert_eq!(parts.len(), 1);
    let (assembled, requests) = &parts[0];
    assert_eq!(requests.len(), 3);
    assert_eq!(
        assembled.keys,
        [
            "t:{ip:1.2.3.4}:a:swc",
            "t:{ip:1.2.3.4}:b:gcra",
            "t:{ip:5.6.7.8}:a:swc"
        ]
    );
    let pa = [1, 10, 1_000, 10, 0];
    let pb = [5, 5, 60_000, 7, 300];
    let expected: Vec<u8> = pa
        .iter()
        .chain(&pb)
        .flat_map(|&x| (x as f64).to_le_bytes())
        .collect();
    assert_eq!(assembled.params[..], expected[..]);
    let u32s = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    // The policy of each state.
    assert_eq!(assembled.states[..], u32s(&[1, 2, 1])[..]);
    // Per request: the mode, the number of policies, then (state, cost) pairs.
    let request = |mode: u8, pairs: &[(u32, f64)]| {
        let mut out = vec![mode];
        out.extend((pairs.len() as u32).to_le_bytes());
        for &(state, cost) in pairs {
            out.extend(state.to_le_bytes());
            out.extend(cost.to_le_bytes());
        }
        out
    };
    let mut requests = request(1, &[(1, 1.0), (2, 2.0)]);
    requests.extend(request(0, &[(1, 3.0)]));
    requests.extend(request(2, &[(3, 1.0)]));
    assert_eq!(assembled.requests, requests);
    // redis-rs shows only the counts: three state keys and their three override keys;
    // the clock and the three binary strings (parameters, states, requests).
    let dbg = format!("{:?}", core.invocation(assembled));
    assert!(dbg.contains("keys: 6"), "{dbg}");
    assert!(dbg.contains("args: 4"), "{dbg}");

    // The same state key with other parameters starts a second call.
    let a_bigger = Policy::new("a", Rate::per_second(20)).unwrap();
    let split = [
        core.request(&hot, std::slice::from_ref(&a), units(&[1]), Mode::Charge),
        core.request(
            &hot,
            std::slice::from_ref(&a_bigger),
            units(&[1]),
            Mode::Charge,
        ),
    ];
    let parts = assemble(&split);
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[1].1.len(), 1);
}

#[test]
fn a_batch_of_many_keys_names_each_state_once() {
    // Past a handful of states the call looks them up through a map rather than a scan:
    // both must give every request the state of its own key.
    let core = test_core();
    let a = Policy::new("a", Rate::per_second(10)).unwrap();
    let keys: Vec<Key> = (0..40)
        .map(|i| Key::new("ip", format!("10.0.0.{i}").as_str()))
        .collect();
    // Every key twice: in order, then in reverse.
    let batch: Vec<Request> = keys
        .iter()
        .chain(keys.iter().rev())
        .map(|k| core.request(k, std::slice::from_ref(&a), units(&[1]), Mode::Charge))
        .collect();
    let parts = assemble(&batch);
    assert_eq!(parts.len(), 1);
    let (assembled, requests) = &parts[0];
    assert_eq!(requests.len(), 80);
    assert_eq!(assembled.keys.len(), 40);
    assert_eq!(assembled.states.len(), 40 * 4);
    // Each request: mode, one policy, its state (u32) and cost (f64).
    let mut seen = std::collections::HashSet::new();
    for (request, bytes) in batch.iter().zip(assembled.requests.chunks(17)) {
        let state = u32::from_le_bytes(bytes[5..9].try_into().unwrap()) as usize;
        assert_eq!(assembled.keys[state - 1], request.keys[0]);
        seen.insert(state);
    }
    assert_eq!(seen.len(), 40);
}

#[test]
fn replies_of_the_wrong_shape_are_protocol_errors() {
    let core = test_core();
    let five = Policy::new("five", Rate::per_second(5)).unwrap();
    let ten = Policy::new("ten", Rate::per_second(10)).unwrap();
    let key = Key::new("ip", "1");
    let one = [core.request(&key, std::slice::from_ref(&five), units(&[1]), Mode::Charge)];
    let two = [core.request(&key, &[five, ten], units(&[1, 1]), Mode::Charge)];
    let failed = |reply: &[u8], requests: &[Request]| match parse_batch_reply(reply, requests) {
        Ok(mut r) if r.len() == 1 => matches!(r.pop(), Some(Err(StoreError::Protocol(_)))),
        _ => false,
    };
    // Too few fields for its policies: the whole call fails.
    let mut short = packed(1, &[]);
    short.push(1);
    short.extend(2.0f64.to_le_bytes());
    assert!(matches!(
        parse_batch_reply(&short, &one),
        Err(StoreError::Protocol(_))
    ));
    // A negative number, or an overall answer that disagrees: the request fails.
    assert!(failed(&packed(1, &[(1, [-2.0, 0.0, 0.0, 0.0])]), &one));
    assert!(failed(&packed(0, &[(1, [2.0, 0.0, 0.0, 0.0])]), &one));
    let reply = packed(
        0,
        &[(1, [2.0, 0.0, 0.0, 0.0]), (0, [0.0, 900.0, 300.0, 0.0])],
    );
    let d = parse_batch_reply(&reply, &two)
        .unwrap()
        .pop()
        .unwrap()
        .unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.governing_index(), 1);
    assert_eq!(d.retry_after_millis(), 300);
    assert_eq!(d.limit(), 10);
}

/// One request's packed answer: status, then per policy allowed and four numbers.
fn packed(status: i8, policies: &[(i8, [f64; 4])]) -> Vec<u8> {
    let mut out = vec![status as u8];
    for (allowed, numbers) in policies {
        out.push(*allowed as u8);
        for n in numbers {
            out.extend(n.to_le_bytes());
        }
    }
    out
}

#[test]
fn packed_batch_replies_are_read_per_request_and_checked() {
    let core = test_core();
    let a = Policy::new("a", Rate::per_second(10)).unwrap();
    let one = std::slice::from_ref(&a);
    let batch = [
        core.request(&Key::new("ip", "1"), one, units(&[1]), Mode::Charge),
        core.request(&Key::new("ip", "2"), one, units(&[1]), Mode::Charge),
        core.request(&Key::new("ip", "3"), one, units(&[1]), Mode::Charge),
    ];
    let mut reply = packed(1, &[(1, [9.0, 1_000.0, 0.0, 0.0])]);
    let message = b"tollgate: t:{ip:2}:a:swc holds a value of another type";
    reply.push(-1i8 as u8);
    reply.extend((message.len() as u32).to_le_bytes());
    reply.extend(message);
    reply.extend(packed(0, &[(0, [0.0, 1_000.0, 250.0, 0.0])]));
    let results = parse_batch_reply(&reply, &batch).unwrap();
    assert_eq!(results.len(), 3);
    let first = results[0].as_ref().unwrap();
    assert!(first.is_allowed());
    assert_eq!(first.remaining(), 9);
    assert!(
        matches!(&results[1], Err(StoreError::Backend(m)) if m.message().as_bytes() == message),
        "{:?}",
        results[1]
    );
    let third = results[2].as_ref().unwrap();
    assert!(!third.is_allowed());
    assert_eq!(third.retry_after_millis(), 250);

    // Cut short, left over, or a number that is not whole: the call fails as a protocol
    // error rather than inventing an answer.
    let protocol = |reply: &[u8], requests: &[Request]| {
        matches!(
            parse_batch_reply(reply, requests),
            Err(StoreError::Protocol(_))
        )
    };
    assert!(protocol(&reply[..reply.len() - 1], &batch));
    assert!(protocol(&reply[..3], &batch));
    assert!(protocol(&[reply.as_slice(), &[0]].concat(), &batch));
    for bad in [0.5, -0.5, f64::NAN, f64::INFINITY, 1e300] {
        let bad_reply = packed(1, &[(1, [bad, 1_000.0, 0.0, 0.0])]);
        assert!(protocol(&bad_reply, &batch[..1]), "{bad}");
    }
}
